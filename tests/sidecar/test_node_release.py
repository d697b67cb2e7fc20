"""Per-node release through real sidecars (gRPC, Unix sockets) on a coordinator over a real redis-server:
a two-node job's first node goes to another job's phase before its second node released (I2); a rank that
dies on one node frees that node alone when its lease lapses, the other only once its own rank released."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from rollmux.core.model import JobSpec, Pool
from rollmux.wire.client import CoordinatorClient

from .test_agent import Rank, holder, start_rank, wait_for

pytestmark = pytest.mark.parametrize("coordinator", ["redis"], indirect=True)


def _register(coordinator, name: str, rollout_gpus: int) -> str:  # type: ignore[no-untyped-def]
    spec = JobSpec(name=name, n_rollout_gpus=rollout_gpus, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)
    return str(CoordinatorClient(coordinator.address).register_job(spec).token)


def test_a_released_node_goes_to_the_next_job_before_the_other_node_released(coordinator, make_node) -> None:
    nodes = {n: make_node(n, Pool.ROLLOUT) for n in ("r0", "r1")}
    make_node("t0", Pool.TRAIN)
    ta = _register(coordinator, "job-a", 2)  # rolls out on r0 and r1
    tb = _register(coordinator, "job-b", 1)  # packed on one of them
    client = CoordinatorClient(coordinator.address)
    (shared,) = client.job("job-b", tb).status().rollout_nodes
    assert set(client.job("job-a", ta).status().rollout_nodes) == {"r0", "r1"}
    (other,) = {"r0", "r1"} - {shared}
    a_shared, a_other = Rank(nodes[shared].socket, "job-a", ta, 0), Rank(nodes[other].socket, "job-a", ta, 1)
    b = Rank(nodes[shared].socket, "job-b", tb, 0)
    lease = a_shared.acquire("rollout", 0)
    assert a_other.acquire("rollout", 0).epoch == lease.epoch and sorted(lease.nodes) == ["r0", "r1"]
    got: dict[str, object] = {}
    waiter = threading.Thread(target=lambda: got.update(b=b.acquire("rollout", 0)))
    waiter.start()
    assert a_shared.release(lease.epoch).node_released  # the shared node's sidecar releases its node alone
    waiter.join(30)
    assert not waiter.is_alive() and got["b"].nodes == [shared]  # type: ignore[attr-defined]
    assert holder(coordinator, other) == "job-a" and holder(coordinator, shared) == "job-b"
    status = client.job("job-a", ta).status()
    assert (status.next_phase.value, status.permit_state) == ("rollout", "granted")  # not past it yet
    assert a_other.release(lease.epoch).node_released
    assert holder(coordinator, other) == ""
    status = client.job("job-a", ta).status()
    assert status.next_phase.value == "train"  # queued only with the last node


def test_a_rank_killed_on_one_node_frees_that_node_at_its_ttl_and_the_other_after_its_own_release(
        coordinator, make_node) -> None:
    """A real rank process of job a is SIGKILLed mid-phase on `other`: that sidecar stops renewing, so `other`
    is freed only when its lease lapses (TTL 5 s); `shared` stays a's until a's rank there released; the
    phase is fenced (not advanced) and the job stays registered."""
    nodes = {n: make_node(n, Pool.ROLLOUT) for n in ("r0", "r1")}
    make_node("t0", Pool.TRAIN)
    ta = _register(coordinator, "job-a", 2)
    tb = _register(coordinator, "job-b", 1)
    client = CoordinatorClient(coordinator.address)
    (shared,) = client.job("job-b", tb).status().rollout_nodes
    (other,) = {"r0", "r1"} - {shared}
    a_shared, b = Rank(nodes[shared].socket, "job-a", ta, 0), Rank(nodes[shared].socket, "job-b", tb, 0)
    lease = a_shared.acquire("rollout", 0)
    victim = start_rank(nodes[other].socket, "job-a", ta, 1)  # inside the same Rollout(0) on `other`
    try:
        got: dict[str, object] = {}
        waiter = threading.Thread(target=lambda: got.update(b=b.acquire("rollout", 0)))
        waiter.start()
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        wait_for(lambda: "job_aborted" in " ".join(nodes[other].agent.status()["events"]), "the sidecar to see it")
        died = time.monotonic()
        assert nodes[other].agent.active_epochs() == [] and holder(coordinator, other) == "job-a"
        wait_for(lambda: holder(coordinator, other) == "", "the dead rank's node to lapse (TTL 5 s)")
        assert time.monotonic() - died > 2.0, "the dead rank's node was freed before its lease lapsed"
        time.sleep(1.0)  # well past the lapse: the other node is still the job's, its rank has not released
        assert holder(coordinator, shared) == "job-a" and waiter.is_alive()
        assert a_shared.release(lease.epoch).node_released
        waiter.join(30)
        assert not waiter.is_alive() and got["b"].nodes == [shared]  # type: ignore[attr-defined]
        status = client.job("job-a", ta).status()  # fenced: the phase did not complete, it is not skipped
        assert (status.next_phase.value, status.next_iteration, status.permit_state) == ("rollout", 0, "expired")
        assert "rank_dead" in " ".join(nodes[other].agent.status()["events"])
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
