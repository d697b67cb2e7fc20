"""The live coordinator runs the simulator's policy (issue 14): work-aware joins on a fixed fleet,
best moves carried out as directives, regrouping on learning events.

Against the real services where the decision goes over gRPC (a real redis-server and the threaded
coordinator of conftest), on the runtime with a fake clock where a scenario needs many phases.
"""

from __future__ import annotations

import pytest

from rollmux.coordinator.profiler import resolve
from rollmux.coordinator.service.api import ServiceConfig
from rollmux.coordinator.service.client import CoordinatorClient
from rollmux.coordinator.service.runtime import Runtime
from rollmux.model import ClusterSpec, JobSpec, Pool

from .builders import TB, FakeClock
from .conftest import add_node

redis_only = pytest.mark.parametrize("coordinator", ["redis"], indirect=True)


def stretching(name: str) -> JobSpec:
    """A train-heavy job: two of them on one training node run at 1.84x the solo period."""
    return JobSpec(name=name, n_rollout_gpus=8, n_train_gpus=8, t_roll_s=20, t_train_s=230, slo=2.0,
                   rollout_state_bytes=10**9, train_state_bytes=10**9)


@redis_only
def test_a_work_aware_refusal_goes_alone_where_nodes_are_free_and_joins_where_none_are(
        client: CoordinatorClient, coordinator) -> None:
    for i in range(3):  # each rollout node's host DRAM holds one job's rollout state
        add_node(client, f"r{i}", Pool.ROLLOUT, host_dram_bytes=int(1.5e9))
    for i in range(2):
        add_node(client, f"t{i}", Pool.TRAIN)
    a, b, c = (client.register_job(stretching(n)).status() for n in "abc")
    # b in a's group would stretch it 250 -> 460 s for +$14.80/h: more $ per unit of work than alone.
    assert b.group_id != a.group_id and b.train_nodes != a.train_nodes
    # c likewise, but no training node is free for it alone: the fixed fleet joins it to a group.
    assert c.state == "admitted" and c.group_id in (a.group_id, b.group_id) and c.rollout_nodes == ("r2",)


def test_work_aware_off_takes_the_cheapest_join() -> None:
    clock = FakeClock()
    rt = Runtime(ClusterSpec(), ServiceConfig(work_aware=False), clock=clock, wall=clock)
    for node_id, pool, dram in (("r0", Pool.ROLLOUT, int(1.5e9)), ("r1", Pool.ROLLOUT, int(1.5e9)),
                                ("t0", Pool.TRAIN, TB), ("t1", Pool.TRAIN, TB)):
        rt.register_node(node_id=node_id, pool=pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800", gpu_count=8,
                         host_dram_bytes=dram, nvml={})
        rt.node_connected(node_id)
    for name in "ab":
        rt.register_job(resolve(stretching(name), ClusterSpec()), token_sha256="t", nonce_sha256="n" + name)
    assert rt.jobs["b"].group_id == rt.jobs["a"].group_id  # +$14.80/h beats $57.04/h alone
