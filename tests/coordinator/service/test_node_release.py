"""Per-node release (I2) on the fake clock: a node's sidecar frees that node alone; the permit ends with
its last node; a lease lapses per node (a node whose sidecar stopped renewing is freed alone, the phase
then ends fenced); expiry takes back only the nodes still held; a seeded property run over random jobs."""

from __future__ import annotations

import json
import random

import pytest

from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import InvalidArgumentError, PermitState
from rollmux.coordinator.service.runtime.records import PermitRecord
from rollmux.core.model import Phase, next_phase

from .builders import grant, make_runtime, register, spec


def two_node_rollout(rt: Runtime) -> tuple[str, str]:
    """Job a rolls out on two nodes, job b is packed on one of them: (shared node, a's other node)."""
    register(rt, "a", nr=16)
    register(rt, "b", nr=8)
    (shared,) = rt.state.jobs["b"].rollout_nodes
    (other,) = set(rt.state.jobs["a"].rollout_nodes) - {shared}
    return shared, other


def half_released(rt: Runtime, duration_s: float = 1.0):  # type: ignore[no-untyped-def]
    """`two_node_rollout` with a's rollout granted and released on the shared node: (shared, other, permit)."""
    shared, other = two_node_rollout(rt)
    pa = grant(rt, "a")
    rt.release("a", pa.epoch, duration_s, node_id=shared)
    return shared, other, pa


def test_a_node_released_by_its_sidecar_goes_to_the_next_job_while_the_other_node_holds() -> None:
    rt, _ = make_runtime()
    shared, other = two_node_rollout(rt)
    pa = grant(rt, "a")
    res = rt.release("a", pa.epoch, 3.0, node_id=shared)
    assert not res.already_released and res.held_nodes == (other,)
    assert (res.next_phase, res.next_iteration) == (Phase.TRAIN, 0)
    permit = rt.state.permits["a"]
    assert permit.state is PermitState.GRANTED and permit.nodes == (other,) and permit.freed_nodes == (shared,)
    assert rt.state.permits["b"].state is PermitState.GRANTED and rt.leases.holder[shared] == "b"  # before a's other node
    assert rt.leases.holder[other] == "a"
    rt.check_invariants()
    last = rt.release("a", pa.epoch, 5.0, node_id=other)
    assert last.held_nodes == () and rt.state.permits["a"].phase is Phase.TRAIN  # next phase queued with the last node
    assert rt.state.permits["a"].observed_roll_s == 5.0  # the longest node's duration
    assert other not in rt.leases.holder
    rt.check_invariants()


def test_the_next_phase_waits_until_every_node_released() -> None:
    rt, _ = make_runtime()
    half_released(rt)
    assert rt.state.permits["a"].phase is Phase.ROLLOUT
    from rollmux.coordinator.service.runtime.api import FailedPreconditionError

    with pytest.raises(FailedPreconditionError, match="out of order"):  # a sidecar asking early loops on this
        rt.acquire("a", Phase.TRAIN, 0)


def test_a_repeated_node_release_is_a_no_op_and_a_foreign_node_is_refused() -> None:
    rt, _ = make_runtime()
    shared, other, pa = half_released(rt)
    rt.take_changes()
    again = rt.release("a", pa.epoch, 1.0, node_id=shared)
    assert again.already_released and again.held_nodes == (other,)
    assert rt.take_changes() == ({}, [])
    with pytest.raises(InvalidArgumentError, match=r"node t0 released job 'a'.*holds node\(s\) " + other):
        rt.release("a", pa.epoch, 1.0, node_id="t0")
    assert rt.take_changes() == ({}, [])
    rt.release("a", pa.epoch, 1.0, node_id=other)
    assert rt.release("a", pa.epoch, 1.0, node_id=other).already_released  # after the permit ended too


def test_a_release_without_node_id_ends_the_whole_permit() -> None:
    rt, _ = make_runtime()
    shared, other, pa = half_released(rt)
    res = rt.release("a", pa.epoch, 2.0)
    assert res.held_nodes == () and rt.state.permits["a"].phase is Phase.TRAIN and other not in rt.leases.holder
    rt.check_invariants()


def test_expiry_of_a_partly_released_permit_frees_only_the_nodes_still_held() -> None:
    rt, clock = make_runtime(ttl=5.0)
    shared, other, pa = half_released(rt)
    pb = rt.state.permits["b"]
    rt.take_changes()
    clock.advance(4.0)
    rt.renew("b", pb.epoch)
    clock.advance(2.0)
    assert rt.expire() == ["a"]
    _, notices = rt.take_changes()
    revoked = [n for n in notices if n.kind.value == "revoked"]
    assert [n.nodes for n in revoked] == [(other,)]  # not the node b holds now
    assert rt.leases.holder == {shared: "b"} and rt.state.permits["b"].state is PermitState.GRANTED
    rt.check_invariants()


def test_a_node_whose_sidecar_stops_renewing_lapses_alone_and_the_phase_ends_fenced() -> None:
    """A rank of job a died on `other`: that sidecar stops naming the epoch in its heartbeats. Its node is
    freed at its TTL (fenced by a revocation to it alone); `shared` stays a's until its sidecar releases
    it; the permit then ends EXPIRED (parked), and the phase is granted again, not skipped."""
    rt, clock = make_runtime(ttl=5.0)
    shared, other = two_node_rollout(rt)
    pa = grant(rt, "a")
    rt.take_changes()
    for _ in range(3):  # shared's sidecar renews every 2 s; other's is silent
        clock.advance(2.0)
        rt.heartbeat(shared, [pa.epoch])
        rt.heartbeat(other, [])
        rt.expire()
    assert rt.leases.holder.get(other) is None and rt.leases.holder[shared] == "a"
    permit = rt.state.permits["a"]
    assert permit.state is PermitState.GRANTED and permit.nodes == (shared,) and permit.lapsed_nodes == (other,)
    _, notices = rt.take_changes()
    assert [(n.kind.value, n.nodes, n.epoch) for n in notices if n.kind.value == "revoked"] == \
        [("revoked", (other,), pa.epoch)]
    assert rt.state.permits["b"].state is not PermitState.GRANTED  # b waits for shared, which a's ranks still hold
    rt.check_invariants()
    res = rt.release("a", pa.epoch, 1.0, node_id=shared)
    assert (res.next_phase, res.next_iteration, res.held_nodes) == (Phase.ROLLOUT, 0, ())
    assert rt.state.permits["a"].state is PermitState.EXPIRED and rt.leases.holder.get(shared) == "b"
    again = rt.acquire("a", Phase.ROLLOUT, 0)  # the job asks again: the same phase, from the start
    assert again is not None and (again.phase, again.iteration) == (Phase.ROLLOUT, 0)
    assert again.state is PermitState.QUEUED  # behind b, which holds shared now
    rt.check_invariants()


def test_a_heartbeat_renews_only_its_own_nodes_part_of_the_lease() -> None:
    rt, clock = make_runtime(ttl=5.0)
    shared, other = two_node_rollout(rt)
    pa = grant(rt, "a")
    clock.advance(4.0)
    rt.heartbeat(shared, [pa.epoch])
    rt.heartbeat(other, [pa.epoch + 1])  # another epoch: no renewal
    assert rt.next_deadline() == pytest.approx(clock.now + 1.0)
    clock.advance(1.0)
    assert rt.expire() == [] and rt.state.permits["a"].nodes == (shared,)
    clock.advance(4.0)
    assert rt.expire() == ["a"] and rt.state.permits["a"].state is PermitState.EXPIRED and "a" not in rt.leases.holder.values()
    rt.check_invariants()


def test_the_stored_form_keeps_node_releases_and_older_records_load() -> None:
    rt, clock = make_runtime()
    shared, other, _ = half_released(rt, 4.0)
    back = Runtime.from_records(rt.records(), rt.state.cluster, rt.state.config, clock=clock, wall=clock)
    assert back.state.permits["a"].freed_nodes == (shared,) and back.state.permits["a"].node_release_s == 4.0
    assert back.leases.holder == {other: "a", shared: "b"}
    old = json.loads(rt.state.permits["a"].to_json())
    del old["freed_nodes"], old["node_release_s"]
    loaded = PermitRecord.from_json(json.dumps(old))
    assert loaded.freed_nodes == () and loaded.node_release_s == 0.0 and loaded.nodes == (other,)


# ----------------------------------------------------------------------------- property run
SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_jobs_and_node_release_orders_keep_the_invariants(seed: int) -> None:
    """Random multi-node jobs, random per-node release orders, whole releases and lapsed leases.

    After every step: one holder per node (`check_invariants`); a node a lease held leaves it only
    by that lease's own release naming it (or naming none) or by the lease's expiry; every job's
    grants follow on-policy order (a lapsed phase is granted again, never skipped).
    """
    rng = random.Random(seed)
    rt, clock = make_runtime(n_rollout=4, n_train=2, ttl=5.0)
    for i in range(rng.randint(2, 5)):
        register(rt, f"j{i}", nr=rng.choice((8, 16, 24)), nt=rng.choice((8, 16)), slo=rng.choice((2.0, 4.0)))
    jobs = [j for j, rec in rt.state.jobs.items() if rec.state.value == "admitted"]
    granted: dict[str, list[tuple[Phase, int, int]]] = {j: [] for j in jobs}
    for _ in range(301):
        for j in jobs:
            p = rt.state.permits[j]
            if p.state is PermitState.GRANTED and (not granted[j] or granted[j][-1][2] != p.epoch):
                if granted[j]:
                    ph, it, _ = granted[j][-1]
                    assert (p.phase, p.iteration) in ((ph, it), next_phase(ph, it)), \
                        f"seed {seed}: {j} granted {p.phase.value}({p.iteration}) after {ph.value}({it})"
                else:
                    assert (p.phase, p.iteration) == (Phase.ROLLOUT, 0)
                granted[j].append((p.phase, p.iteration, p.epoch))
        before = {n: (j, rt.state.permits[j].epoch) for n, j in rt.leases.holder.items()}
        allowed: set[str] = set()  # nodes this step may take from their lease
        name = rng.choice(jobs)
        permit = rt.state.permits[name]
        roll = rng.random()
        if permit.state is PermitState.GRANTED and roll < 0.75:
            if roll < 0.6:
                node = rng.choice(permit.nodes)
                rt.release(name, permit.epoch, rng.uniform(0.5, 3.0), node_id=node)
                allowed = {node}
            else:
                allowed = set(permit.nodes)
                rt.release(name, permit.epoch, 1.0)
        elif roll < 0.85:
            clock.advance(rng.uniform(0.5, 3.0))
            live = {j: rt.state.permits[j] for j in jobs}
            allowed = {n for n, (h, _) in before.items() if live[h].expires_at.get(n, clock.now + 1) <= clock.now}
            expired = rt.expire()
            for j in jobs:  # a live job renews most of the time: the job itself, or some of its nodes' sidecars
                p = live[j]
                if j not in expired and p.state is PermitState.GRANTED and rng.random() < 0.7:
                    if rng.random() < 0.5:
                        rt.renew(j, p.epoch)
                    for n in p.nodes:
                        if rng.random() < 0.8:
                            rt.heartbeat(n, [p.epoch])
        elif permit.state is not PermitState.GRANTED:
            rt.acquire(name, permit.phase, permit.iteration)
        rt.check_invariants()
        for node, (job, epoch) in before.items():
            now = rt.leases.holder.get(node)
            still = now == job and rt.state.permits[job].epoch == epoch
            assert still or node in allowed, f"seed {seed}: node {node} of {job} epoch {epoch} taken by step"
    assert sum(len(g) for g in granted.values()) > len(jobs), f"seed {seed}: the run made no progress"


# ------------------------------------------------------------- a grant on a node without ranks
def test_a_node_granted_to_a_job_without_ranks_there_is_released_on_its_behalf() -> None:
    from rollmux.coordinator.service.runtime.leases import UnusedNode

    rt, _ = make_runtime()
    shared, other = two_node_rollout(rt)
    pa = grant(rt, "a")
    assert rt.grant_without_rank(shared, "a", pa.epoch) is UnusedNode.KEPT_NO_ATTACH_YET  # ranks may still come
    rt.report_attach("a", other)
    assert rt.grant_without_rank(other, "a", pa.epoch) is UnusedNode.KEPT_ATTACHED
    assert rt.grant_without_rank(shared, "a", pa.epoch) is UnusedNode.RELEASED
    assert rt.leases.holder[shared] == "b" and rt.state.permits["a"].nodes == (other,)
    assert rt.grant_without_rank(shared, "a", pa.epoch) is UnusedNode.STALE
    rt.check_invariants()


def test_a_permit_no_node_released_is_not_ended_by_a_node_without_ranks() -> None:
    from rollmux.coordinator.service.runtime.leases import UnusedNode

    rt, _ = make_runtime()
    register(rt, "a")
    pa = grant(rt, "a")
    (node,) = pa.nodes
    rt.report_attach("a", "t0")
    assert rt.grant_without_rank(node, "a", pa.epoch) is UnusedNode.KEPT_NOTHING_RAN
    assert rt.state.permits["a"].state is PermitState.GRANTED and rt.state.permits["a"].phase is Phase.ROLLOUT


# ------------------------------------------------------------------------ I4: where it runs
def test_an_attach_outside_the_placement_is_refused_naming_both_node_sets() -> None:
    from rollmux.coordinator.service.runtime.api import PlacementMismatchError

    rt, _ = make_runtime()
    register(rt, "a")
    placed = rt.state.job_nodes(rt.state.jobs["a"])
    outside = next(n for n in rt.state.nodes if n not in placed)
    assert rt.report_attach("a", placed[0]) == (placed, (placed[0],))
    rt.take_changes()
    with pytest.raises(PlacementMismatchError) as err:
        rt.report_attach("a", outside)
    assert all(n in str(err.value) for n in (*placed, outside))
    assert rt.take_changes() == ({}, []) and rt.state.jobs["a"].attach_nodes == (placed[0],)


def test_a_pending_job_is_admitted_onto_the_nodes_its_ranks_attached_on() -> None:
    from rollmux.core.model import Pool

    from .builders import TB

    rt, _ = make_runtime(n_rollout=1, n_train=1)
    register(rt, "a", slo=1.0)  # r0 + t0, a group of its own
    assert register(rt, "p", slo=1.0).state.value == "pending"  # no free nodes
    for n, pool in (("r1", Pool.ROLLOUT), ("r2", Pool.ROLLOUT), ("t1", Pool.TRAIN), ("t2", Pool.TRAIN)):
        rt.register_node(node_id=n, pool=pool, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * TB, nvml={})
    assert rt.report_attach("p", "r2") == ((), ("r2",))
    assert rt.report_attach("p", "t2") == ((), ("r2", "t2"))
    rt.node_connected("r1")
    rt.node_connected("t1")  # free nodes, but not where p's ranks are: p waits, naming them
    assert rt.state.jobs["p"].state.value == "pending" and "attached on node(s) r2, t2" in views.wait_reason(rt, "p")
    rt.check_invariants()
    rt.node_connected("r2")
    rt.node_connected("t2")
    assert rt.state.jobs["p"].state.value == "admitted"
    assert set(rt.state.job_nodes(rt.state.jobs["p"])) == {"r2", "t2"}
    rt.check_invariants()


def test_a_pending_job_that_would_join_a_group_elsewhere_forms_a_new_group_of_its_attach_nodes() -> None:
    """The policy's cheapest place for p is a join of a's group (+$0/h), but p's ranks attached on r1 and t1:
    p is admitted into a new group of exactly those nodes once they are free, never into a's."""
    from rollmux.core.model import Pool

    from .builders import TB

    rt, _ = make_runtime(n_rollout=0, n_train=0)
    for n, pool in (("r0", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("r1", Pool.ROLLOUT), ("t1", Pool.TRAIN)):
        rt.register_node(node_id=n, pool=pool, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * TB, nvml={})
    register(rt, "a")
    register(rt, "p")
    rt.report_attach("p", "r1")
    rt.report_attach("p", "t1")
    rt.node_connected("r0")
    rt.node_connected("t0")
    assert rt.state.jobs["a"].state.value == "admitted" and rt.state.jobs["p"].state.value == "pending"
    assert rt.state.policy.place(rt.state.jobs["p"].spec, rt.state.placement).group_id == rt.state.jobs["a"].group_id
    rt.node_connected("r1")
    rt.node_connected("t1")
    p = rt.state.jobs["p"]
    assert p.state.value == "admitted" and p.group_id != rt.state.jobs["a"].group_id
    assert set(rt.state.job_nodes(p)) == {"r1", "t1"}
    assert set(grant(rt, "p").nodes) == {"r1"}  # its first permit: Rollout(0) where its rollout ranks are
    rt.check_invariants()


def test_pinned_options_are_joins_of_the_attach_nodes_groups_then_new_groups_cheapest_first() -> None:
    from rollmux.coordinator.policy.admission import pinned_options

    rt, _ = make_runtime()
    register(rt, "a")
    job = spec("q")
    gid = rt.state.jobs["a"].group_id
    a_nodes = rt.state.job_nodes(rt.state.jobs["a"])
    opts = pinned_options(rt.state.policy, job, rt.state.placement, a_nodes)
    assert opts and opts[0].group_id == gid  # a +$0/h join of the group holding the attach nodes
    assert [d.delta_usd_per_h for d in opts] == sorted(d.delta_usd_per_h for d in opts)
    assert any(d.group_id is None for d in opts)
    elsewhere = pinned_options(rt.state.policy, job, rt.state.placement, ("r3",))  # a node in no group
    assert elsewhere and all(d.group_id is None for d in elsewhere)


def test_a_grant_no_ask_was_answered_with_is_taken_back_when_the_job_has_no_rank_anywhere() -> None:
    from rollmux.coordinator.service.runtime.leases import UnusedNode

    rt, _ = make_runtime()
    register(rt, "a")
    first = rt.state.permits["a"]  # granted at admission, before a's processes asked
    assert first.state is PermitState.GRANTED and not first.picked and len(first.nodes) == 1
    (node,) = first.nodes
    epoch = first.epoch
    assert rt.grant_without_rank(node, "a", epoch) is UnusedNode.TAKEN_BACK
    assert rt.state.permits["a"].state is PermitState.QUEUED and node not in rt.leases.holder  # not granted until a asks
    rt.check_invariants()
    p = rt.acquire("a", Phase.ROLLOUT, 0)
    assert p is not None and p.state is PermitState.GRANTED and p.epoch > epoch and p.nodes == (node,)
    assert rt.grant_without_rank(node, "a", p.epoch) is UnusedNode.KEPT_NO_ATTACH_YET  # asked: its rank may come


def test_a_multi_node_grant_is_kept_for_ranks_that_attach_node_by_node() -> None:
    from rollmux.coordinator.service.runtime.leases import UnusedNode

    rt, _ = make_runtime()
    shared, _other = two_node_rollout(rt)
    pa = rt.state.permits["a"]
    assert pa.state is PermitState.GRANTED and not pa.picked and len(pa.nodes) == 2
    assert rt.grant_without_rank(shared, "a", pa.epoch) is UnusedNode.KEPT_NO_ATTACH_YET
