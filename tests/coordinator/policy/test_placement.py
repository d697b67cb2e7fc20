from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.coordinator.policy import (
    ClusterState,
    PolicyConfig,
    PolicyError,
    RejectReason,
    RollMuxPolicy,
    Strategy,
)
from rollmux.coordinator.policy.api import UnknownPolicyError
from rollmux.coordinator.policy.intra_group import cycle_time
from rollmux.coordinator.policy.placement import isolated_cost
from rollmux.coordinator.policy.registry import create_policy
from rollmux.core.model import TB, ClusterSpec, JobSpec
from rollmux.testing.builders import make_job

ALG1 = PolicyConfig(modes=False, train_scaling=False)  # the paper's Algorithm 1: every job a disaggregated member, the
# training pool never grown by a join (test_modes.py has the modes, test_train_scaling below the rest)

NODE_R = 8 * 1.85
NODE_T = 8 * 5.28


def place_all(jobs: list[JobSpec], cluster: ClusterSpec | None = None, **cfg) -> tuple[ClusterState, list]:
    state = ClusterState(cluster or ClusterSpec())
    policy = RollMuxPolicy(PolicyConfig(**{"modes": False, **cfg}))
    decisions = []
    for j in jobs:
        d = policy.place(j, state)
        state.apply(j, d)
        decisions.append(d)
    return state, decisions


CASES = [
    # (id, existing jobs, arriving job, expected strategy, expected delta $/h, reason seen on the way)
    ("complementary-jobs-pack-directly", [make_job("A", roll=300, train=100)],
     make_job("B", roll=100, train=300), Strategy.DIRECT_PACKING, 0.0, None),
    ("rollout-heavy-pair-scales-rollout", [make_job("A", roll=300, train=100, slo=1.1)],
     make_job("B", roll=300, train=100, slo=1.1), Strategy.ROLLOUT_SCALING, NODE_R, RejectReason.SLO),
    ("tight-slo-goes-isolated", [make_job("A", roll=100, train=300, slo=1.0)],
     make_job("B", roll=100, train=300, slo=1.0), Strategy.ISOLATED, NODE_R + NODE_T, RejectReason.SLO),
    ("short-job-cannot-wait-for-long-cycle", [make_job("A", roll=500, train=500)],
     make_job("B", roll=50, train=50, slo=2.0), Strategy.ISOLATED, NODE_R + NODE_T, RejectReason.SLO),
    ("dram-full-rollout-node-scales", [make_job("A", roll=300, train=100, roll_gb=1500)],
     make_job("B", roll=100, train=300, roll_gb=600), Strategy.ROLLOUT_SCALING, NODE_R, RejectReason.HOST_DRAM),
    ("bigger-train-pool-needed", [make_job("A", roll=300, train=100)],
     make_job("B", roll=100, train=300, n_t=16), Strategy.ISOLATED, NODE_R + 2 * NODE_T, RejectReason.TRAIN_POOL),
    ("train-dram-full", [make_job("A", roll=300, train=100, train_gb=1200)],
     make_job("B", roll=100, train=300, train_gb=900), Strategy.ISOLATED, NODE_R + NODE_T, RejectReason.HOST_DRAM),
]


@pytest.mark.parametrize(("existing", "job", "strategy", "delta", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_placement_table(existing, job, strategy, delta, reason) -> None:
    state, _ = place_all(existing)
    decision = RollMuxPolicy(ALG1).place(job, state)
    assert decision.strategy is strategy
    assert decision.delta_usd_per_h == pytest.approx(delta)
    if reason is not None:
        assert reason in {r.reason for r in decision.rejections}, decision.explain()
    state.apply(job, decision)


def test_rejection_messages_name_the_job_and_numbers() -> None:
    state, _ = place_all([make_job("A", roll=100, train=300, slo=1.0)])
    decision = RollMuxPolicy(ALG1).place(make_job("B", roll=100, train=300, slo=1.0), state)
    slo = [r for r in decision.rejections if r.reason is RejectReason.SLO]
    assert any("SLO of job" in r.message and "> 1.00" in r.message for r in slo), decision.explain()


def test_algorithm1_prunes_saturated_groups() -> None:
    state, _ = place_all([make_job("A", roll=300, train=100), make_job("B", roll=100, train=300)])
    # A + B: T_load = 400 = T_cycle -> saturated, so C cannot even be considered there.
    decision = RollMuxPolicy(PolicyConfig(fill_saturated=False, modes=False)).place(make_job("C", roll=50, train=50, slo=2.0), state)
    assert decision.rejections[0].reason is RejectReason.SATURATED
    assert decision.strategy is Strategy.ISOLATED


def test_fill_saturated_packs_when_every_slo_still_holds() -> None:
    state, _ = place_all([make_job("A", roll=300, train=100, slo=1.5), make_job("B", roll=100, train=300, slo=1.5)])
    # C makes the group over-saturated (period 450 > T_cycle 400) but within every SLO budget.
    decision = RollMuxPolicy(ALG1).place(make_job("C", roll=50, train=50, slo=5.0), state)
    assert decision.group_id == "g0" and decision.delta_usd_per_h == 0.0
    assert decision.t_coexec_s["A"] == pytest.approx(450.0)
    # ...and refuses when the period would break A's SLO (1.5 x 400 = 600 s).
    tight = RollMuxPolicy(ALG1).place(make_job("D", roll=250, train=250, slo=5.0), state)
    assert tight.group_id is None and RejectReason.SLO in {r.reason for r in tight.rejections}


def test_group_size_limit() -> None:
    # Rollout-heavy jobs with little slack (SLO 1.05: above the 2% co-execution margin) scale the
    # rollout pool: the group stays unsaturated.
    jobs = [make_job(f"j{i}", roll=100, train=10, slo=1.05) for i in range(3)]
    state, decisions = place_all(jobs, max_group_size=2)
    assert decisions[2].strategy is Strategy.ISOLATED
    assert RejectReason.GROUP_FULL in {r.reason for r in decisions[2].rejections}


def test_ties_go_to_the_earlier_group() -> None:
    state, _ = place_all([make_job("A", roll=300, train=100), make_job("A2", roll=300, train=100)],
                         max_group_size=1)
    assert len(state.groups) == 2
    decision = RollMuxPolicy(ALG1).place(make_job("B", roll=100, train=300), state)
    assert decision.group_id == "g0"


def test_departure_releases_nodes_and_cost_drops() -> None:
    state, _ = place_all([make_job("A", roll=300, train=100, slo=1.1), make_job("B", roll=300, train=100, slo=1.1)])
    assert state.usd_per_h == pytest.approx(2 * NODE_R + NODE_T)
    released = state.remove_job("B")
    assert len(released) == 1 and state.usd_per_h == pytest.approx(NODE_R + NODE_T)
    released = state.remove_job("A")
    assert len(released) == 2 and state.usd_per_h == 0 and not state.groups


def test_unresolved_job_is_refused() -> None:
    with pytest.raises(PolicyError, match="not resolved"):
        RollMuxPolicy(ALG1).place(JobSpec(name="j", n_rollout_gpus=8, n_train_gpus=8), ClusterState())


def test_registry() -> None:
    assert isinstance(create_policy("rollmux"), RollMuxPolicy)
    with pytest.raises(UnknownPolicyError, match="Did you forget"):
        create_policy("nope")


def test_explain_lists_choice_and_rejections() -> None:
    state, _ = place_all([make_job("A", roll=100, train=300, slo=1.0)])
    text = RollMuxPolicy(ALG1).place(make_job("B", roll=100, train=300, slo=1.0), state).explain()
    assert text.splitlines()[0].startswith("B -> new group by isolated")
    assert "rejected g0" in text


@st.composite
def arrivals(draw: st.DrawFn) -> list[JobSpec]:
    jobs = []
    for i in range(draw(st.integers(1, 14))):
        size = draw(st.sampled_from([8, 8, 8, 16]))
        jobs.append(make_job(f"j{i}", roll=draw(st.floats(20, 600)), train=draw(st.floats(20, 600)),
                             slo=draw(st.floats(1.0, 2.0)), n_r=size, n_t=draw(st.sampled_from([8, size])),
                             roll_gb=draw(st.sampled_from([113.4, 275.7, 445.4, 490.3])),
                             train_gb=draw(st.sampled_from([156.2, 240.0, 456.1, 520.4]))))
    return jobs


@settings(max_examples=150, deadline=None)
@given(arrivals(), st.integers(0, 10**6))
def test_invariants_hold_for_random_arrivals_and_departures(jobs: list[JobSpec], seed: int) -> None:
    rng = random.Random(seed)
    cluster = ClusterSpec(host_dram_bytes=2 * TB)
    state = ClusterState(cluster)
    policy = RollMuxPolicy(ALG1)
    alive: list[JobSpec] = []
    for job in jobs:
        if alive and rng.random() < 0.3:
            state.remove_job(alive.pop(rng.randrange(len(alive))).name)
        before = state.usd_per_h
        decision = policy.place(job, state)
        assert decision.delta_usd_per_h <= isolated_cost(job, cluster) + 1e-9  # never dearer than isolation
        state.apply(job, decision)
        assert state.usd_per_h == pytest.approx(before + decision.delta_usd_per_h)
        alive.append(job)
        for group in state.groups.values():
            group.check_invariants()  # host DRAM within capacity on every node
            period = cycle_time(group.timings())
            for m in group.members.values():  # the simulation shows no member beyond its SLO
                assert period <= m.budget_s * (1 + 1e-9), (group.group_id, m.spec.name)


def test_restored_groups_are_indexed_and_ids_continue() -> None:
    state, _ = place_all([make_job("A", roll=300, train=100)])
    g = state.groups["g0"]
    restored = ClusterState()
    restored.restore_group("g0", g.train_nodes, tuple(g.rollout),
                           [(m.spec, m.rollout_nodes) for m in g.members.values()])
    decision = RollMuxPolicy(ALG1).place(make_job("B", roll=100, train=300), restored)
    assert decision.group_id == "g0" and decision.strategy is Strategy.DIRECT_PACKING
    other = RollMuxPolicy(ALG1).place(make_job("C", roll=50, train=50, slo=1.0), restored)
    assert restored.apply(make_job("C", roll=50, train=50, slo=1.0), other).group_id == "g1"


def test_train_scaling_shares_the_rollout_node_and_trains_beside_the_member() -> None:
    # Train-heavy jobs too slow to queue on one training node (SLO 1.2), light enough to share a
    # rollout node: B brings its own training node (+1 node) and saves a rollout node over a new group.
    state, _ = place_all([make_job("A", roll=50, train=200, slo=1.2)])
    b = make_job("B", roll=50, train=200, slo=1.2)
    off = RollMuxPolicy(ALG1).place(b, state)
    assert off.strategy is Strategy.ISOLATED and off.delta_usd_per_h == pytest.approx(NODE_R + NODE_T)
    decision = RollMuxPolicy(PolicyConfig(modes=False, train_scaling=True)).place(b, state)
    assert decision.strategy is Strategy.TRAIN_SCALING and decision.group_id == "g0", decision.explain()
    assert decision.delta_usd_per_h == pytest.approx(NODE_T) and decision.new_train_nodes == 1
    # Rollouts queue on the shared node (50 + 50 < 250), Trains run side by side: each keeps its solo 250 s.
    assert decision.t_coexec_s == pytest.approx({"A": 250.0, "B": 250.0})
    group = state.apply(b, decision)
    assert len(group.train_nodes) == 2 and group.members["A"].train_nodes != group.members["B"].train_nodes
    assert cycle_time(group.timings()) == pytest.approx(250.0)
    b_train = group.members["B"].train_nodes
    assert state.remove_job("B") == list(b_train)  # B's training node leaves with it, the shared rollout node stays
    assert group.train_nodes == group.members["A"].train_nodes and state.usd_per_h == pytest.approx(NODE_R + NODE_T)
