"""The runtime's transitions on a fake clock: queues, round-robin order, leases, refusals, recovery."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import JobState, NodeState, PermitState
from rollmux.coordinator.service.runtime.state import NoticeKind
from rollmux.core.model import Phase
from rollmux.wire.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, StaleEpochError

from .builders import make_runtime, register, spec


def grant(rt: Runtime, name: str):  # type: ignore[no-untyped-def]
    p = rt.state.permits[name]
    got = rt.acquire(name, p.phase, p.iteration)
    assert got is not None and got.state is PermitState.GRANTED, views.wait_reason(rt, name)
    return got


def test_packed_jobs_share_a_rollout_node_in_round_robin_order() -> None:
    rt, _ = make_runtime()
    a = register(rt, "a", nr=16)  # two rollout nodes
    b = register(rt, "b", nr=8)  # packed onto one of a's nodes
    assert a.group_id == b.group_id and set(b.rollout_nodes) < set(a.rollout_nodes)
    shared = b.rollout_nodes[0]
    pa = grant(rt, "a")
    assert rt.state.permits["b"].state is PermitState.QUEUED
    assert "behind" in views.wait_reason(rt, "b") or "held by job 'a'" in views.wait_reason(rt, "b")
    rt.release("a", pa.epoch, 1.0)
    pb = grant(rt, "b")  # b's rollout gets the node as soon as a releases it
    assert pb.nodes == (shared,)
    pa_train = grant(rt, "a")  # a trains while b rolls out
    assert pa_train.phase is Phase.TRAIN
    rt.release("a", pa_train.epoch, 1.0)
    pa_sync = grant(rt, "a")  # sync continues train on the training nodes
    assert pa_sync.phase is Phase.SYNC
    rt.release("a", pa_sync.epoch, 1.0)
    # a's rollout(1) queues behind b on the shared node: round-robin order holds
    assert rt.state.permits["a"].state is PermitState.QUEUED and rt.grant_queues.queues[shared] == ["a"]
    rt.release("b", pb.epoch, 1.0)
    assert grant(rt, "a").iteration == 1
    rt.check_invariants()


def test_epochs_increase_and_stale_epochs_are_refused_without_change() -> None:
    rt, clock = make_runtime(ttl=5.0)
    register(rt, "a")
    e0 = grant(rt, "a").epoch
    clock.advance(6.0)
    assert rt.expire() == ["a"]
    assert rt.state.permits["a"].state is PermitState.EXPIRED
    rt.take_changes()
    for call in (lambda: rt.release("a", e0, 1.0), lambda: rt.renew("a", e0),
                 lambda: rt.report_progress("a", e0, 1, 2)):
        with pytest.raises(StaleEpochError, match="stale"):
            call()
    assert rt.take_changes() == ({}, [])
    assert grant(rt, "a").epoch > e0  # asking again requeues and grants with a new epoch


def test_expired_lease_goes_to_the_next_job() -> None:
    rt, clock = make_runtime(ttl=5.0)
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    grant(rt, "a")
    clock.advance(3.0)
    rt.renew("a", rt.state.permits["a"].epoch)
    clock.advance(3.0)
    assert rt.expire() == []  # renewed
    clock.advance(5.0)
    assert rt.expire() == ["a"]
    assert rt.state.permits["b"].state is PermitState.GRANTED
    assert rt.acquire("a", Phase.ROLLOUT, 0).state is PermitState.QUEUED  # back at the tail
    rt.check_invariants()


@pytest.mark.parametrize("phase,iteration", [(Phase.TRAIN, 0), (Phase.ROLLOUT, 1), (Phase.SYNC, 0)],
                         ids=["train-before-rollout", "skip-iteration", "sync-before-train"])
def test_out_of_order_phase_is_refused(phase: Phase, iteration: int) -> None:
    rt, _ = make_runtime()
    register(rt, "a")
    rt.take_changes()
    with pytest.raises(FailedPreconditionError, match="out of order"):
        rt.acquire("a", phase, iteration)
    assert rt.take_changes() == ({}, [])


def test_release_is_idempotent_for_the_same_epoch() -> None:
    rt, _ = make_runtime()
    register(rt, "a")
    p = grant(rt, "a")
    first = rt.release("a", p.epoch, 2.0)
    again = rt.release("a", p.epoch, 2.0)
    assert again.already_released and (again.next_phase, again.next_iteration) == (first.next_phase, 0)
    assert rt.state.permits["a"].observed_roll_s == 2.0


def test_observed_durations_update_estimates() -> None:
    rt, _ = make_runtime()
    register(rt, "a")
    for roll in (10.0, 20.0):
        p = grant(rt, "a")
        rt.release("a", p.epoch, roll)
        for _ in range(2):
            p = grant(rt, "a")
            rt.release("a", p.epoch, 4.0)
    assert rt.state.permits["a"].observed_roll_s == pytest.approx(15.0)  # alpha 0.5
    assert rt.state.permits["a"].observed_train_s > 0


def test_a_pending_job_never_blocks_a_later_one_that_fits() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    register(rt, "a")
    b = register(rt, "b", nr=32, slo=1.0)  # needs 4 rollout nodes of its own: none free
    c = register(rt, "c", nr=8)  # fits beside a
    d = register(rt, "d", nr=8, slo=1.0)  # needs nodes of its own too
    assert b.state is JobState.PENDING and d.state is JobState.PENDING
    assert c.state is JobState.ADMITTED  # b, waiting ahead of it, does not hold it back
    assert "position 1" in views.wait_reason(rt, "b") and "position 2" in views.wait_reason(rt, "d")
    assert rt.acquire("b", Phase.ROLLOUT, 0) is None
    from rollmux.core.model import Pool

    for node_id, pool in (("x1", Pool.ROLLOUT), ("x2", Pool.TRAIN)):
        rt.register_node(node_id=node_id, pool=pool, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12,
                         nvml={})
        assert rt.state.nodes[node_id].state is NodeState.LOST  # registered, but no sidecar stream yet
        rt.node_connected(node_id)
    assert rt.state.jobs["d"].state is JobState.ADMITTED and rt.state.jobs["b"].state is JobState.PENDING
    for i in range(3, 8):
        rt.register_node(node_id=f"x{i}", pool=Pool.ROLLOUT if i < 7 else Pool.TRAIN, gpu_type="H20",
                         gpu_count=8, host_dram_bytes=2 * 10**12, nvml={})
        rt.node_connected(f"x{i}")
    assert rt.state.jobs["b"].state is JobState.ADMITTED
    rt.check_invariants()


def test_a_spec_no_node_set_could_ever_hold_is_refused_naming_the_limit() -> None:
    rt, _ = make_runtime()
    before = rt.records()
    with pytest.raises(InvalidArgumentError, match="over the limit of 1024 nodes per pool"):
        register(rt, "huge", nr=10_000)
    with pytest.raises(InvalidArgumentError, match="does not fit the host DRAM"):
        rt.register_job(replace(spec("fat"), rollout_state_bytes=3 * 10**12), token_sha256="t", nonce_sha256="n")
    assert rt.records() == before and rt.take_changes() == ({}, [])


def test_remove_job_revokes_its_lease_and_frees_the_node() -> None:
    rt, _ = make_runtime()
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    grant(rt, "a")
    rt.remove_job("a", reason="test")
    assert "a" not in rt.state.jobs and rt.state.permits["b"].state is PermitState.GRANTED
    with pytest.raises(NotFoundError):
        rt.acquire("a", Phase.ROLLOUT, 0)
    rt.check_invariants()


def test_drain_finishes_the_running_permit_then_blocks_grants() -> None:
    rt, _ = make_runtime()
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    p = grant(rt, "a")
    node = rt.state.jobs["b"].rollout_nodes[0]
    assert rt.drain_node(node) is NodeState.DRAINING
    rt.release("a", p.epoch, 1.0)
    assert rt.state.nodes[node].state is NodeState.DRAINED
    assert rt.state.permits["b"].state is PermitState.QUEUED
    assert "drained" in views.wait_reason(rt, "b")


def test_a_release_reaches_node_streams_only_as_the_next_grant_or_a_state_change() -> None:
    """A job's own release sends its nodes no snapshot (their ranks ended the phase); a node that
    drains with it, and every grant, still reach the node's stream."""
    rt, _ = make_runtime()
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    p = grant(rt, "a")
    drained, kept = rt.state.jobs["b"].rollout_nodes[0], next(n for n in p.nodes if n not in rt.state.jobs["b"].rollout_nodes)
    rt.take_changes()
    rt.drain_node(drained)
    rt.take_changes()
    rt.release("a", p.epoch, 1.0)
    q = rt.acquire("a", Phase.TRAIN, 0)
    assert q is not None and q.state is PermitState.GRANTED
    _, notices = rt.take_changes()
    assert {n for x in notices if x.kind is NoticeKind.NODE for n in x.nodes} == {drained}  # its state changed
    assert kept not in {n for x in notices for n in x.nodes}  # released by its job: nothing to tell
    assert [x.nodes for x in notices if x.kind is NoticeKind.GRANTED] == [q.nodes]


def test_long_tail_migration_frees_nodes_for_the_next_rollout() -> None:
    rt, _ = make_runtime()
    register(rt, "a", nr=16)
    b = register(rt, "b", nr=8)
    p = grant(rt, "a")
    assert rt.report_progress("a", p.epoch, 50, 100) is None  # not tail-bound yet
    with pytest.raises(InvalidArgumentError):
        rt.report_progress("a", p.epoch, 101, 100)
    d = rt.report_progress("a", p.epoch, 90, 100)
    assert d is not None and d.release_nodes == b.rollout_nodes and len(d.keep_nodes) == 1
    assert rt.state.permits["b"].state is PermitState.GRANTED  # b's rollout starts on the freed node
    assert rt.report_progress("a", p.epoch, 95, 100) is None  # once per lease
    rt.release("a", p.epoch, 1.0)
    rt.check_invariants()


def test_reload_from_records_resumes_queues_and_leases() -> None:
    rt, clock = make_runtime()
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    p = grant(rt, "a")
    epoch = p.epoch
    rt2 = Runtime.from_records(rt.records(), rt.state.cluster, rt.state.config, clock=clock, wall=clock)
    assert all(n.state is NodeState.LOST for n in rt2.state.nodes.values())  # until their sidecars reconnect
    for n in rt2.state.nodes:
        rt2.node_connected(n)
    assert rt2.leases.holder == rt.leases.holder and rt2.grant_queues.queues == rt.grant_queues.queues
    assert rt2.state.permits["a"].epoch == epoch
    rt2.release("a", epoch, 1.0)
    assert rt2.state.permits["b"].state is PermitState.GRANTED
    register(rt2, "c", nr=8, slo=1.0)  # a solo job gets a new group: the restored policy state continues ids
    assert rt2.state.jobs["c"].state is JobState.ADMITTED and rt2.state.jobs["c"].group_id not in ("", rt2.state.jobs["a"].group_id)
    rt2.check_invariants()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_traces_keep_mutual_exclusion_and_on_policy_order(seed: int) -> None:
    rng = random.Random(seed)
    rt, clock = make_runtime(n_rollout=8, n_train=3, ttl=5.0)
    names = [f"j{i}" for i in range(6)]
    for i, n in enumerate(names):
        register(rt, n, nr=16 if i % 2 == 0 else 8)
    done: dict[str, list[tuple[str, int]]] = {n: [] for n in names}
    for _ in range(600):
        n = rng.choice(names)
        p = rt.state.permits[n]
        action = rng.random()
        if p.state is PermitState.GRANTED and action < 0.7:
            done[n].append((p.phase.value, p.iteration))
            rt.release(n, p.epoch, rng.random())
        elif action < 0.9:
            rt.acquire(n, p.phase, p.iteration)
        else:
            clock.advance(rng.random() * 3)
            rt.expire()
        rt.check_invariants()
    for n, phases in done.items():
        expected = [(ph, i) for i in range(len(phases)) for ph in ("rollout", "train", "sync")][:len(phases)]
        assert phases == expected, n
    assert sum(len(v) for v in done.values()) > 100


def test_advance_releases_and_grants_the_next_phase_in_one_transition() -> None:
    rt, _ = make_runtime()
    register(rt, "a", slo=1.0)
    p = grant(rt, "a")
    rt.take_changes()
    res, nxt = rt.advance("a", p.epoch, 1.0)
    assert (res.next_phase, res.next_iteration) == (Phase.TRAIN, 0) and not res.already_released
    assert nxt.state is PermitState.GRANTED and nxt.phase is Phase.TRAIN and nxt.epoch > p.epoch
    writes, _ = rt.take_changes()
    assert "permit/a" in writes  # one batch holds the release and the grant
    with pytest.raises(StaleEpochError):
        rt.advance("a", p.epoch + 100, 1.0)
    assert rt.take_changes() == ({}, [])
    res2, again = rt.advance("a", p.epoch, 1.0)  # a retried advance of the same epoch
    assert res2.already_released and again.epoch == nxt.epoch
    rt.check_invariants()


def test_open_but_silent_node_turns_lost_and_its_lease_expires() -> None:
    rt, clock = make_runtime(n_rollout=1, n_train=1, ttl=10.0, heartbeat_s=2.0)
    lapse = rt.state.config.heartbeat_lapse_s
    register(rt, "a", slo=1.0)
    node = rt.state.jobs["a"].rollout_nodes[0]
    p = grant(rt, "a")
    clock.advance(lapse / 2)
    for n in rt.state.nodes:
        rt.heartbeat(n, [p.epoch])
    assert rt.next_deadline() == clock.now + lapse
    clock.advance(lapse - 0.01)
    rt.expire()
    assert rt.state.nodes[node].state is NodeState.READY  # heard recently enough
    clock.advance(0.02)
    assert rt.expire() == []  # the node is silent but the lease still has time
    assert rt.state.nodes[node].state is NodeState.LOST and node in rt.liveness.connected
    assert "no heartbeat" in rt.state.nodes[node].history[-1][3]
    clock.advance(10.0)
    assert rt.expire() == ["a"]  # nobody renewed it: revoked after its TTL as usual
    assert node not in rt.leases.holder
    assert rt.liveness.heartbeat_changes_state(node)
    rt.heartbeat(node, [])  # heartbeats resume: the node is usable again
    assert rt.state.nodes[node].state is NodeState.READY
    rt.check_invariants()
