"""Per-node release through real sidecars (gRPC, Unix sockets) on a coordinator over a real redis-server:
a two-node job's first node goes to another job's phase before its second node released (I2)."""

from __future__ import annotations

import threading

import pytest

from rollmux.core.model import JobSpec, Pool
from rollmux.wire.client import CoordinatorClient

from .test_agent import Rank, holder

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
