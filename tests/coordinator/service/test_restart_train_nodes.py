"""A coordinator restart keeps each group member on the training nodes it trained on.

A member's training nodes are chosen once, at admission (the least loaded of the group's, `own_train_nodes`),
and its ranks run there (I4). Rebuilt in member order after a restart, they would be chosen again against
other loads: here job c trains on t1 while its group's first member is gone, and a fresh choice gives it t0.
"""

from __future__ import annotations

import json

from rollmux.coordinator.service.runtime import Runtime
from rollmux.coordinator.service.runtime.records import GroupRecord
from rollmux.core.model import Phase

from .builders import FakeClock, grant, make_runtime, register


def _c_on_its_second_training_node() -> tuple[Runtime, FakeClock]:
    """a trains on t0 and t1, b then c on one node each (b: t0, c: t1); b leaves."""
    rt, clock = make_runtime(n_rollout=6, n_train=4)
    for name, nt in (("a", 16), ("b", 8), ("c", 8)):
        register(rt, name, nr=8, nt=nt, slo=4.0)
    rt.remove_job("b", reason="finished")
    assert rt.state.phase_nodes(rt.state.jobs["c"], Phase.TRAIN) == ("t1",)
    return rt, clock


def _restart(rt: Runtime, clock: FakeClock, records: dict[str, str] | None = None) -> Runtime:
    rt2 = Runtime.from_records(records or rt.records(), rt.state.cluster, rt.state.config, clock=clock, wall=clock)
    for n in rt2.state.nodes:
        rt2.node_connected(n)
    return rt2


def test_a_restart_keeps_each_members_training_nodes_and_its_train_permit_names_them() -> None:
    rt, clock = _c_on_its_second_training_node()
    before = {j: rt.state.phase_nodes(rt.state.jobs[j], Phase.TRAIN) for j in ("a", "c")}
    rt2 = _restart(rt, clock)
    assert {j: rt2.state.phase_nodes(rt2.state.jobs[j], Phase.TRAIN) for j in ("a", "c")} == before
    pa = grant(rt2, "a")  # Rollout(0) on the rollout node a and c share
    rt2.release("a", pa.epoch, 1.0)  # a's Train(0) now holds t0 and t1
    pc = grant(rt2, "c")
    rt2.release("c", pc.epoch, 1.0)
    assert {n: q for n, q in rt2.grant_queues.queues.items() if "c" in q} == {"t1": ["c"]}  # c's Train(0) waits where its ranks are
    rt2.check_invariants()


def test_group_records_stored_without_members_training_nodes_still_load() -> None:
    """Records written before the group record named its members' training nodes: the nodes are chosen
    again (the earlier behaviour) and the group is whole."""
    rt, clock = _c_on_its_second_training_node()
    records = dict(rt.records())
    for key in [k for k in records if k.startswith("group/")]:
        raw = json.loads(records[key])
        raw.pop("member_train_nodes")
        records[key] = json.dumps(raw)
        assert GroupRecord.from_json(records[key]).member_train_nodes == {}
    rt2 = _restart(rt, clock, records)
    assert set(rt2.state.phase_nodes(rt2.state.jobs["c"], Phase.TRAIN)) <= {"t0", "t1"}
    assert rt2.state.phase_nodes(rt2.state.jobs["a"], Phase.TRAIN) == ("t0", "t1")
    rt2.check_invariants()
