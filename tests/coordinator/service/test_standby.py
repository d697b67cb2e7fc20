"""Warm standby: two coordinator processes on one real Redis; SIGKILL the leader, the standby takes over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rollmux.core.model import Phase
from rollmux.testing.chaos.procs import CoordinatorProcess, RedisProcess
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import NotReadyError

from .conftest import add_nodes, close_node_streams, job_spec

LEADER_TTL_S = 1.0


def state_of(address: str) -> tuple[bool, int]:
    """(ready, leader fence) as the coordinator at `address` reports it; (False, -1) if it does not answer."""
    c = CoordinatorClient(address, retry_s=2)
    try:
        st = c.cluster_state()
        return st.ready, st.leader_fence
    except NotReadyError:
        return False, -1
    finally:
        c.close()


def wait_for(predicate, timeout: float = 40.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_standby_takes_over_through_the_redis_lease_when_the_leader_is_killed(redis_server: RedisProcess,
                                                                            tmp_path: Path) -> None:
    flags = ["--leader-ttl", str(LEADER_TTL_S)]
    leader = CoordinatorProcess(redis_server.url, tmp_path, instance_id="coord-a", extra=flags)
    standby = CoordinatorProcess(redis_server.url, tmp_path, instance_id="coord-b", extra=flags)
    a, b = leader.address, standby.address
    try:
        leader.start()
        wait_for(lambda: state_of(a)[0])
        standby.start()
        wait_for(lambda: state_of(b)[1] != -1)  # the standby answers...
        time.sleep(2 * LEADER_TTL_S)
        assert not state_of(b)[0], "the standby became ready while the leader held the lease"  # ...but stands by

        client = CoordinatorClient([a, b], retry_s=20)  # leader first, the standby next
        add_nodes(client, 1, 1)
        job = client.register_job(job_spec("a", slo=1.0))
        p = job.acquire(Phase.ROLLOUT, 0, timeout_s=5)
        p = job.advance(p, 0.1, timeout_s=5)
        assert (p.phase, p.iteration) == (Phase.TRAIN, 0)
        _, fence_a = state_of(a)

        leader.kill()  # the leader dies holding a granted lease
        t0 = time.monotonic()
        nxt = job.advance(p, 0.1, timeout_s=10)  # the release of the lease granted by the dead leader
        takeover_s = time.monotonic() - t0
        assert (nxt.phase, nxt.iteration) == (Phase.SYNC, 0) and nxt.epoch > p.epoch
        ready_b, fence_b = state_of(b)
        assert ready_b and fence_b > fence_a, (ready_b, fence_b, fence_a)
        assert job.advance(nxt, 0.1, timeout_s=5).phase is Phase.ROLLOUT  # the job continues on the standby
        status = job.status()
        assert (status.next_phase, status.next_iteration, status.permit_state) == (Phase.ROLLOUT, 1, "granted")
        assert takeover_s < 15 * LEADER_TTL_S, f"takeover took {takeover_s:.1f}s"
        print(f"\nstandby takeover: leader SIGKILL -> next grant from the standby in {takeover_s:.2f}s "
              f"(leader lease TTL {LEADER_TTL_S:g}s), fence {fence_a} -> {fence_b}")
        close_node_streams()
        client.close()
    finally:
        leader.kill()
        standby.kill()
