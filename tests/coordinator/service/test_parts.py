"""Each part of the runtime on its own: what it owns, what it changes, what it tells the shell.

One section per part (`coordinator/service/runtime/`), in the package's order. A part that needs only
the shared state is built alone; the others are taken from a wired `Runtime` (the parts are handed their
neighbours in its constructor) and checked through their own fields and methods. `stored` goes through a
real Redis server and back.
"""

from __future__ import annotations

import asyncio

import pytest

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.regroup import Move
from rollmux.coordinator.service.runtime import Runtime, stored, views
from rollmux.coordinator.service.runtime.api import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobState,
    NodeState,
    NotFoundError,
    PermitState,
    ServiceConfig,
)
from rollmux.coordinator.service.runtime.directives import Directives
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.nodes import NodeLiveness
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.core.model import ClusterSpec, NodeSnapshot, Phase, Pool, RelocationState, Revocation
from tests.coordinator.service.builders import TB, FakeClock, grant, make_runtime, register


def _state(clock: FakeClock, **config: object) -> RuntimeState:
    return RuntimeState(ClusterSpec(), ServiceConfig(policy=PolicyConfig.live(), **config),  # type: ignore[arg-type]
                        clock=clock, wall=clock)


def _node(liveness: NodeLiveness, node_id: str, pool: Pool = Pool.ROLLOUT) -> None:
    liveness.register_node(node_id=node_id, pool=pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800",
                           gpu_count=8, host_dram_bytes=2 * TB, nvml={})


# ------------------------------------------------------------------------------------ RuntimeState


def test_state_counts_epochs_and_arrivals_and_hands_changes_over_once() -> None:
    state = _state(FakeClock())
    assert (state.next_epoch(), state.next_epoch(), state.next_seq()) == (1, 2, 1)
    writes, notices = state.take_changes()
    assert set(writes) == {"meta"} and notices == []
    assert state.take_changes() == ({}, [])
    state.forget("job/x")
    assert state.take_changes()[0] == {"job/x": None}
    with pytest.raises(NotFoundError, match="job 'x' is not registered"):
        state.job("x")
    with pytest.raises(NotFoundError, match="node 'n' is not registered"):
        state.node("n")


# ------------------------------------------------------------------------------------ NodeLiveness


def test_liveness_a_node_is_ready_only_while_its_stream_is_open_and_heard() -> None:
    clock = FakeClock()
    state = _state(clock, heartbeat_interval_s=1.0)
    liveness = NodeLiveness(state)
    _node(liveness, "r0")
    assert state.nodes["r0"].state is NodeState.LOST and not liveness.usable("r0")
    assert liveness.connect("r0") and liveness.usable("r0")
    assert [n.kind for n in state.take_changes()[1]] == [NoticeKind.NODE]
    clock.advance(state.config.heartbeat_lapse_s)
    assert liveness.next_lapse() == clock.now
    liveness.lapse()
    assert state.nodes["r0"].state is NodeState.LOST and liveness.heartbeat_changes_state("r0")
    assert liveness.heard("r0") and state.nodes["r0"].state is NodeState.READY
    liveness.disconnect("r0")
    assert state.nodes["r0"].state is NodeState.LOST and "r0" not in liveness.connected
    with pytest.raises(AlreadyExistsError, match="registered in pool rollout"):
        _node(liveness, "r0", Pool.TRAIN)
    with pytest.raises(InvalidArgumentError, match="not in the coordinator's GPU catalog"):
        liveness.register_node(node_id="x", pool=Pool.ROLLOUT, gpu_type="nope", gpu_count=8, host_dram_bytes=TB,
                               nvml={})


def test_liveness_drain_waits_for_the_running_permit() -> None:
    state = _state(FakeClock())
    liveness = NodeLiveness(state)
    for n in ("r0", "r1"):
        _node(liveness, n)
        liveness.connect(n)
    assert liveness.drain("r0", held=True) is NodeState.DRAINING
    assert liveness.permit_ended("r0") and state.nodes["r0"].state is NodeState.DRAINED
    assert liveness.drain("r1", held=False) is NodeState.DRAINED
    assert not liveness.permit_ended("r1")  # only a DRAINING node turns DRAINED when its permit ends


# ----------------------------------------------------------------------------------- PhaseLearning


def test_learning_a_sync_ends_the_iteration_and_a_departure_forgets_it() -> None:
    rt, _ = make_runtime()
    register(rt, "a")
    learning = rt.learning
    assert isinstance(learning, PhaseLearning) and learning.learner is not None
    permit = grant(rt, "a")
    assert learning.measured("a", permit, 30.0) == (30.0, 0.0)  # a Rollout: its seconds, nothing learned yet
    for phase_s in (30.0, 40.0, 5.0):  # Rollout, Train, Sync of iteration 0
        permit = grant(rt, "a")
        rt.release("a", permit.epoch, phase_s)
    assert len(learning.learned["a"]) == 1
    assert "learn/a" in rt.take_changes()[0]
    learning.forget("a")
    assert "a" not in learning.learned and rt.take_changes()[0] == {"learn/a": None}
    assert learning.next_event() is None


# ------------------------------------------------------------------------------------- GrantQueues


def test_grant_queues_turns_follow_member_order_and_serve_each_node() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    register(rt, "a", nr=8, nt=8)
    register(rt, "b", nr=8, nt=8)
    queues = rt.grant_queues
    pa = grant(rt, "a")
    assert rt.acquire("b", Phase.ROLLOUT, 0).state is PermitState.QUEUED  # type: ignore[union-attr]
    gid = rt.state.jobs["a"].group_id
    assert queues.rings(gid)["r0"].order == ("a", "b")
    assert queues.waiting("r0") == ["b"] and queues.queued_per_node() == {"r0": 1}
    rt.release("a", pa.epoch, 1.0)
    assert queues.served["r0"] == "b" and rt.leases.holder["r0"] == "b"


# ------------------------------------------------------------------------------------------ Leases


def test_leases_one_holder_per_node_renewed_released_or_expired() -> None:
    rt, clock = make_runtime(n_rollout=1, n_train=1, ttl=10.0)
    register(rt, "a")
    leases = rt.leases
    p = grant(rt, "a")
    assert leases.holder == {"r0": "a"} and leases.next_expiry() == clock.now + 10.0
    clock.advance(5.0)
    assert leases.renew("a", p.epoch) == 10.0 and leases.next_expiry() == clock.now + 10.0
    with pytest.raises(FailedPreconditionError):
        leases.renew("a", p.epoch + 1)
    res = leases.release("a", p.epoch, 1.0)
    assert (res.next_phase, res.next_iteration) == (Phase.TRAIN, 0) and "r0" not in leases.holder
    assert leases.release("a", p.epoch, 1.0).already_released
    grant(rt, "a")  # Train on t0
    clock.advance(10.0)
    assert leases.expire() == ["a"] and leases.holder == {}
    assert rt.state.permits["a"].state is PermitState.EXPIRED and "a" in leases.parked()


# ------------------------------------------------------------------------------- LongTailMigration


def test_migration_a_tail_bound_rollout_hands_nodes_to_a_waiting_job() -> None:
    rt, _ = make_runtime(n_rollout=2, n_train=1)
    register(rt, "a", nr=16)
    register(rt, "b", nr=16)
    pa = grant(rt, "a")
    rt.acquire("b", Phase.ROLLOUT, 0)
    with pytest.raises(InvalidArgumentError, match="finished=3 total=2"):
        rt.migration.report_progress("a", pa.epoch, 3, 2)
    assert rt.migration.report_progress("a", pa.epoch, 1, 10) is None  # not tail-bound yet
    decision = rt.migration.report_progress("a", pa.epoch, 9, 10)
    assert decision is not None and len(decision.keep_nodes) == 1 and len(decision.release_nodes) == 1
    assert rt.state.permits["a"].migrated and rt.leases.holder[decision.keep_nodes[0]] == "a"
    assert NoticeKind.MIGRATE in [n.kind for n in rt.take_changes()[1]]


# -------------------------------------------------------------------------------------- Directives


def test_directives_one_epoch_per_move_heard_again_on_reconnect() -> None:
    rt, clock = make_runtime()
    register(rt, "a")
    directives = rt.directives
    assert isinstance(directives, Directives) and not directives.any_pending()
    gid = rt.state.jobs["a"].group_id
    move = Move(job="a", from_group=gid, decision=rt.state.policy.place(  # type: ignore[attr-defined]
        rt.state.jobs["a"].spec, rt.state.placement), reason="test", saving_usd_per_h=0.0, downtime_s=0.0)
    rec = directives.issue([move])
    assert directives.any_pending() and rec.state is RelocationState.PENDING
    assert rec.deadline_unix_s == clock.now + rt.state.config.relocation_deadline_s
    node = rt.state.job_nodes(rt.state.jobs["a"])[0]
    assert [(n.kind, n.job, n.epoch) for n in directives.notices_for(node)] == [(NoticeKind.RELOCATE, "a", rec.epoch)]
    assert directives.notices_for("t-none") == []
    assert directives.drop("a") is rec and not directives.any_pending()


# --------------------------------------------------------------------------------------- Admission


def test_admission_places_what_fits_and_queues_the_rest_in_arrival_order() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    a = register(rt, "a", nr=8, nt=8, t_roll_s=100.0, t_train_s=100.0, slo=1.0)
    b = register(rt, "b", nr=8, nt=8, t_roll_s=100.0, t_train_s=100.0, slo=1.0)
    assert a.state is JobState.ADMITTED and b.state is JobState.PENDING and rt.state.pending() == ["b"]
    assert rt.admission.free_nodes(Pool.ROLLOUT, 0) == []
    released = rt.remove_job("a", reason="test")
    assert set(released) == {"r0", "t0"}
    assert rt.state.jobs["b"].state is JobState.ADMITTED  # the freed nodes admit the next pending job


# ------------------------------------------------------------------------------------- Relocations


def test_relocations_an_ack_of_an_unknown_directive_is_refused() -> None:
    rt, _ = make_runtime()
    register(rt, "a")
    assert rt.relocation.plan_relocations([rt.state.jobs["a"].group_id]) is None  # alone: nothing to gain
    with pytest.raises(FailedPreconditionError, match="no relocation directive with epoch 7"):
        rt.relocation.ack_relocation("a", 7)


# ------------------------------------------------------------------------------------------- views


def test_views_read_the_parts_without_changing_anything() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    register(rt, "a")
    register(rt, "b", slo=1.0)
    p = grant(rt, "a")
    rt.take_changes()
    info = views.job_status(rt, "a")
    assert (info.state, info.permit_state, info.lease.epoch) == ("admitted", "granted", p.epoch)  # type: ignore[union-attr]
    cluster = views.cluster_state(rt, ready=True, fence=3, ttl_s=10.0)
    assert [j.job for j in cluster.jobs] == ["a", "b"] and cluster.leader_fence == 3
    assert {n.node_id: n.holder.job if n.holder else None for n in cluster.nodes} == {"r0": "a", "t0": None}
    snapshot = views.node_event(rt, "r0", Notice(kind=NoticeKind.NODE, nodes=("r0",)))
    assert isinstance(snapshot, NodeSnapshot) and snapshot.holder is not None and snapshot.holder.job == "a"
    assert "pending admission (position 1)" in views.wait_reason(rt, "b")
    assert rt.take_changes() == ({}, [])  # views write nothing
    assert views.job(rt, "zz") is None and views.permit(rt, "zz") is None and not views.has_node(rt, "zz")


def test_views_a_stale_grant_notice_is_not_sent() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    register(rt, "a")
    p = grant(rt, "a")
    assert views.node_event(rt, "r0", Notice(kind=NoticeKind.GRANTED, job="a", epoch=p.epoch)) is not None
    assert views.node_event(rt, "r0", Notice(kind=NoticeKind.GRANTED, job="a", epoch=p.epoch + 1)) is None
    revoked = views.node_event(rt, "r0", Notice(kind=NoticeKind.REVOKED, job="a", epoch=p.epoch, reason="x"))
    assert revoked == Revocation(job="a", epoch=p.epoch, reason="x")


# ------------------------------------------------------------------------------------------ stored


def test_stored_records_round_trip_through_redis(redis_server) -> None:  # type: ignore[no-untyped-def]
    """The stored form written to a real Redis and read back rebuilds the same runtime."""
    from rollmux.coordinator.service.redis_store import RedisStore

    rt, clock = make_runtime()
    register(rt, "a")
    register(rt, "b")
    p = grant(rt, "a")
    rt.release("a", p.epoch, 2.0)
    records = rt.records()
    assert set(records) >= {"meta", "job/a", "job/b", "node/r0", "permit/a"}

    async def go() -> dict[str, str]:
        store = RedisStore(redis_server.url, namespace="parts")
        try:
            fence = await store.acquire_leadership("parts", 5.0)
            assert fence
            await store.commit(records, fence=fence)
            return await store.load()
        finally:
            await store.close()

    loaded = asyncio.run(go())
    assert loaded == records
    back = Runtime.from_records(loaded, rt.state.cluster, rt.state.config, clock=clock, wall=clock)
    again = stored.records(back.state, back.grant_queues.served, back.directives.relocations, back.learning.learned)
    assert {k: v for k, v in again.items() if not k.startswith("node/")} == \
        {k: v for k, v in records.items() if not k.startswith("node/")}
    assert {n: r.state for n, r in back.state.nodes.items()} == dict.fromkeys(rt.state.nodes, NodeState.LOST)
