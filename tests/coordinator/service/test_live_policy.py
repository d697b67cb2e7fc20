"""The live coordinator runs the simulator's policy: work-aware joins on a fixed fleet,
best moves carried out as directives, regrouping on learning events.

Against the real services where the decision goes over gRPC (a real redis-server and the threaded
coordinator of conftest), on the runtime with a fake clock where a scenario needs many phases.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.profiler import resolve
from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import PermitState, ServiceConfig
from rollmux.core.model import ClusterSpec, JobSpec, Pool, RelocationState
from rollmux.wire.client import CoordinatorClient

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
    rt = Runtime(ClusterSpec(), ServiceConfig(policy=PolicyConfig.live(work_aware=False)), clock=(clock := FakeClock()), wall=clock)
    add_nodes(rt, rollout=2, train=2, rollout_dram=int(1.5e9))
    for name in "ab":
        rt.register_job(resolve(stretching(name), ClusterSpec()), token_sha256="t", nonce_sha256="n" + name)
    assert rt.state.jobs["b"].group_id == rt.state.jobs["a"].group_id  # +$14.80/h beats $57.04/h alone
    assert not rt.state.policy.config.work_aware  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------
# best move: a pool merge carried out as one directive per moving job
# ------------------------------------------------------------------------------------------------

def add_nodes(rt: Runtime, *, rollout: int, train: int, first_rollout: int = 0, rollout_dram: int = TB) -> None:
    """Connected nodes r<first_rollout>.. and t0.. (8 GPUs; host DRAM 1 TB, `rollout_dram` on rollout nodes)."""
    for node_id, pool in (*((f"r{i}", Pool.ROLLOUT) for i in range(first_rollout, first_rollout + rollout)),
                          *((f"t{i}", Pool.TRAIN) for i in range(train))):
        rt.register_node(node_id=node_id, pool=pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800", gpu_count=8,
                         host_dram_bytes=rollout_dram if pool is Pool.ROLLOUT else TB, nvml={})
        rt.node_connected(node_id)


def add_jobs(rt: Runtime, names: str, *, t_roll_s: float, t_train_s: float, slo: float, elastic: bool = False) -> None:
    """Register one 8 + 8-GPU job per letter of `names`, with these planned times."""
    for name in names:
        s = JobSpec(name=name, n_rollout_gpus=8, n_train_gpus=8, t_roll_s=t_roll_s, t_train_s=t_train_s, slo=slo,
                    rollout_state_bytes=10**9, train_state_bytes=10**9, elastic=elastic)
        rt.register_job(resolve(s, ClusterSpec()), token_sha256="t", nonce_sha256="n" + name)


def two_lone_jobs(n_train: int = 3, config: ServiceConfig | None = None) -> Runtime:
    """A and B (100 + 300 s, SLO 1.3) cannot share one training node, so each runs alone (g0, g1);
    pooling both training nodes in one group (one rollout node) meets both SLOs for less."""
    rt = Runtime(ClusterSpec(), config or ServiceConfig(), clock=(clock := FakeClock()), wall=clock)
    add_nodes(rt, rollout=2, train=n_train)
    add_jobs(rt, "AB", t_roll_s=100, t_train_s=300, slo=1.3, elastic=True)  # elastic: their Trains may pool
    assert [rt.state.jobs[n].group_id for n in "AB"] == ["g0", "g1"]
    rt.take_changes()
    return rt


def to_boundary(rt: Runtime, name: str, seconds: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> None:
    """Run `name`'s Rollout, Train and Sync, each measured at `seconds` (its next Rollout is then not
    handed out: a boundary)."""
    for duration_s in seconds:
        p = rt.state.permits[name]
        got = rt.acquire(name, p.phase, p.iteration)
        assert got is not None and got.state is PermitState.GRANTED, views.wait_reason(rt, name)
        rt.release(name, got.epoch, duration_s)
        rt.check_invariants()


def test_a_pool_merge_switches_each_job_on_its_own_ack() -> None:
    rt = two_lone_jobs()
    a = rt.plan_relocations(["g0"])
    assert a is not None and "pool their training nodes" in a.reason
    b = rt.directives.relocations["B"]
    assert b.epoch == a.epoch and b.state is RelocationState.PENDING and a.to_group == b.to_group == ""

    to_boundary(rt, "B")  # B reaches its boundary first: it opens the pooled group (the two are alike)
    rec, _ = rt.ack_relocation("B", b.epoch)
    assert rec.state is RelocationState.SWITCHED and rec.to_group == "g2" and len(rec.train_nodes) == 2
    assert rt.directives.relocations["A"].to_group == "g2" and rt.directives.relocations["A"].state is RelocationState.PENDING
    assert {n: rt.state.jobs[n].group_id for n in "AB"} == {"A": "g0", "B": "g2"}  # each alone, on its own nodes
    rt.check_invariants()
    rt = Runtime.from_records(rt.records(), rt.state.cluster, rt.state.config, clock=rt.state.clock, wall=rt.state.wall)  # a restart
    for node_id in list(rt.state.nodes):
        rt.node_connected(node_id)

    to_boundary(rt, "A")
    rec, _ = rt.ack_relocation("A", a.epoch)
    assert rec.state is RelocationState.SWITCHED
    assert list(rt.state.placement.groups) == ["g2"] and list(rt.state.placement.groups["g2"].members) == ["B", "A"]
    g2 = rt.state.placement.groups["g2"]
    assert len(g2.train_nodes) == 2 and len(g2.rollout) == 1  # one rollout node released, no training node bought
    assert [rt.state.permits[n].iteration for n in "AB"] == [1, 1] and rt.state.jobs["A"].moves == rt.state.jobs["B"].moves == 1
    rt.check_invariants()
    for _ in range(2):  # both go on in the merged group, in turn
        for name in "BA":
            to_boundary(rt, name)
    assert [rt.state.permits[n].iteration for n in "AB"] == [3, 3]


def test_a_merge_whose_second_half_expires_leaves_the_first_alone_and_looks_again() -> None:
    rt = two_lone_jobs(config=ServiceConfig(relocation_deadline_s=5.0))
    a = rt.plan_relocations(["g0"])
    assert a is not None
    to_boundary(rt, "A")
    assert rt.ack_relocation("A", a.epoch)[0].state is RelocationState.SWITCHED
    rt.state.clock.advance(6.0)  # type: ignore[attr-defined]
    rt.expire()
    assert rt.directives.relocations["B"].state is RelocationState.EXPIRED and rt.state.jobs["B"].group_id == "g1"
    assert {n: rt.state.jobs[n].group_id for n in "AB"} == {"A": "g2", "B": "g1"}
    rt.check_invariants()  # a valid placement: A alone in the pooled group, B where it was
    back = rt.directives.relocations["A"]  # A, alone in a training pool larger than it needs, may go back
    assert back.epoch > a.epoch and back.state is RelocationState.PENDING and back.from_group == "g2"


def test_a_merge_that_does_not_fit_the_free_nodes_is_not_directed() -> None:
    rt = two_lone_jobs(n_train=2)  # the pooled group would need B's training node while B runs on it
    assert rt.plan_relocations(["g0"]) is None and rt.directives.relocations == {}


def test_the_second_half_of_a_merge_waits_for_the_job_that_opens_the_group() -> None:
    rt = Runtime(ClusterSpec(), ServiceConfig(), clock=(clock := FakeClock()), wall=clock)
    add_nodes(rt, rollout=3, train=4)
    for name, n_train, t_train in (("A", 16, 300), ("B", 8, 150)):  # A trains on two nodes: it opens the pool
        s = JobSpec(name=name, n_rollout_gpus=8, n_train_gpus=n_train, t_roll_s=100, t_train_s=t_train, slo=1.3,
                    rollout_state_bytes=10**9, train_state_bytes=10**9, elastic=True)
        rt.register_job(resolve(s, ClusterSpec()), token_sha256="t", nonce_sha256="n" + name)
    a = rt.plan_relocations(["g1"])  # planned for B; the directive returned is the first half's
    assert a is not None and a.job == "A"
    b = rt.directives.relocations["B"]
    assert b.epoch == a.epoch
    to_boundary(rt, "B")
    rec, note = rt.ack_relocation("B", b.epoch)
    assert rec.state is RelocationState.PENDING and "waiting for A" in note and rt.state.jobs["B"].group_id == "g1"
    to_boundary(rt, "A")
    assert rt.ack_relocation("A", b.epoch)[0].state is RelocationState.SWITCHED
    to_boundary(rt, "B")
    assert rt.ack_relocation("B", b.epoch)[0].state is RelocationState.SWITCHED
    (g,) = rt.state.placement.groups.values()
    assert list(g.members) == ["A", "B"] and len(g.train_nodes) == 3 and len(g.rollout) == 1
    rt.check_invariants()


# ------------------------------------------------------------------------------------------------
# regroup on learning events
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("on", [True, False], ids=["regroup-on-learn", "no-regroup-on-learn"])
def test_a_learning_event_looks_for_moves_in_the_group(on: bool) -> None:
    # Planned at 100 + 300 s, A and B could not share; measured at 2 + 1 s they can. The iteration that
    # makes B's times learned (A's are already) is a learning event: B is directed into A's group.
    rt = two_lone_jobs(config=ServiceConfig(policy=PolicyConfig.live(regroup_on_learn=on)))
    for _ in range(3):  # learn_min_samples
        to_boundary(rt, "A", (2.0, 0.5, 0.5))
    assert rt.state.placement.groups["g0"].members["A"].profile.learned and rt.directives.relocations == {}
    for _ in range(3):
        to_boundary(rt, "B", (2.0, 0.5, 0.5))
    assert rt.state.placement.groups["g1"].members["B"].profile.learned
    # the search is queued for the paced planner (`Coordinator._replanner`), not made in the release
    # both events queued, oldest first; planned once both are learned, g0's search finds the merge
    assert rt.directives.relocations == {} and list(rt.learning.replan) == (["g0", "g1"] if on else [])
    rt.plan_deferred()
    if on:
        assert [(r.job, r.from_group, r.to_group) for r in rt.directives.relocations.values()] == [("A", "g0", "g1")]
        assert list(rt.learning.replan) == ["g1"] and rt.plan_deferred() is None  # kept while a directive is pending
        assert list(rt.learning.replan) == ["g1"]
    else:
        assert rt.directives.relocations == {}


def test_a_member_its_learned_times_put_over_its_slo_is_rescued_whatever_it_costs() -> None:
    # Planned at 40 + 10 s, A and C share g0; measured at 1 + 4 s their two Trains on one node make a
    # period of 8 s, over the 7.5 s their SLO allows: the learning event moves one to a group of its own.
    rt = Runtime(ClusterSpec(), ServiceConfig(), clock=(clock := FakeClock()), wall=clock)
    add_nodes(rt, rollout=2, train=2)
    add_jobs(rt, "AC", t_roll_s=40, t_train_s=10, slo=1.5)
    assert rt.state.jobs["A"].group_id == rt.state.jobs["C"].group_id == "g0"
    for _ in range(3):
        for name in "AC":
            to_boundary(rt, name, (1.0, 3.0, 1.0))
    assert list(rt.learning.rescue_due) == ["g0"] and rt.directives.relocations == {}  # queued for the paced planner, at the front
    rt.plan_deferred()
    (rec,) = rt.directives.relocations.values()
    assert rec.reason.startswith("SLO risk in g0") and rec.to_group == ""
    to_boundary(rt, rec.job, (1.0, 3.0, 1.0))
    done, _ = rt.ack_relocation(rec.job, rec.epoch)
    assert done.state is RelocationState.SWITCHED  # taken though a group of its own costs more
    assert {rt.state.jobs[n].group_id for n in "AC"} == {"g0", "g1"}
    rt.check_invariants()


# ------------------------------------------------------------------------------------------------
# bounded searches (the event loop serves every call in flight)
# ------------------------------------------------------------------------------------------------

def test_the_live_merge_search_prices_at_most_its_bound_of_lone_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Six lone jobs that could pool pairwise: unbounded, a merge search for F prices all five others;
    # the live coordinator's (merge_candidates) stops after its bound, and the move it finds still pays.
    from rollmux.coordinator.policy import api as policy_api
    from rollmux.coordinator.policy import regroup

    monkeypatch.setattr(policy_api, "LIVE_MERGE_CANDIDATES", 2)
    rt = two_lone_jobs(n_train=6)
    add_nodes(rt, rollout=4, train=0, first_rollout=2)
    add_jobs(rt, "CDEF", t_roll_s=100, t_train_s=300, slo=1.3, elastic=True)
    assert len({rt.state.jobs[n].group_id for n in "ABCDEF"}) == 6
    priced: list[str] = []
    real = regroup._pair_cost
    monkeypatch.setattr(regroup, "_pair_cost", lambda a, b, *args, **kw: priced.append(b.name) or real(a, b, *args, **kw))
    assert rt.state.policy.config.merge_candidates == 2
    gid = rt.state.jobs["F"].group_id
    moves = regroup._pool_merge(rt.state.placement, rt.state.policy, "F", gid, rt.relocation.remaining_s)
    assert priced == ["A", "B"] and moves  # stopped after two, and the best of them pays
    priced.clear()
    unbounded = type(rt.state.policy)(replace(rt.state.policy.config, merge_candidates=None))
    regroup._pool_merge(rt.state.placement, unbounded, "F", gid, rt.relocation.remaining_s)
    assert priced == ["A", "B", "C", "D", "E"]


# ------------------------------------------------------------------------------------------------
# admission with lookahead (policy.admission.place_pending)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lookahead", [8, 0], ids=["lookahead", "one-by-one"])
def test_jobs_pending_together_are_admitted_together(lookahead: int) -> None:
    # Three 32-GPU jobs wait for nodes; one by one the first goes alone co-located (no other job can
    # share that group), knowing the others are pending it opens one they share: the offline optimum
    # (tests/coordinator/policy/test_admission.py has the same three).
    from rollmux.coordinator.policy import RollMuxPolicy
    from rollmux.coordinator.policy.optimum import optimal_partition
    from rollmux.coordinator.service.runtime.state import live_policy_config

    config = ServiceConfig(policy=PolicyConfig.live(modes=True))
    policy = RollMuxPolicy(replace(live_policy_config(config), lookahead_jobs=lookahead))
    rt = Runtime(ClusterSpec(), config, clock=(clock := FakeClock()), wall=clock, policy=policy)
    specs = [resolve(JobSpec(name=name, n_rollout_gpus=32, n_train_gpus=32, t_roll_s=roll, t_train_s=train, slo=slo,
                             rollout_state_bytes=10**9, train_state_bytes=10**9), ClusterSpec())
             for name, roll, train, slo in (("a", 167, 47, 1.2), ("b", 170, 328, 1.95), ("c", 238, 549, 1.66))]
    for s in specs:
        rt.register_job(s, token_sha256="t", nonce_sha256="n" + s.name)
    assert rt.state.pending() == ["a", "b", "c"]  # no node yet
    for node_id, pool in (*((f"r{i}", Pool.ROLLOUT) for i in range(12)), *((f"t{i}", Pool.TRAIN) for i in range(12))):
        rt.register_node(node_id=node_id, pool=pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800", gpu_count=8,
                         host_dram_bytes=TB, nvml={})
    for node_id in sorted(rt.state.nodes, key=lambda n: (n[0] == "r", int(n[1:]))):  # training nodes first: all fit
        rt.node_connected(node_id)
    assert rt.state.pending() == []
    rt.check_invariants()
    optimum = optimal_partition(specs, ClusterSpec(), policy.config).usd_per_h
    usd = rt.state.placement.usd_per_h
    assert usd == pytest.approx(optimum) if lookahead else usd > optimum * 1.2
