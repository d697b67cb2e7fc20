from __future__ import annotations

import pytest

from rollmux.coordinator.policy.api import PolicyConfig, Strategy
from rollmux.coordinator.policy.baselines import (
    MostIdlePolicy,
    OptPolicy,
    RandomPolicy,
    SoloDPolicy,
    colocated,
    gavel_plus,
    idle_fraction,
    solo_d_allocation,
)
from rollmux.coordinator.policy.baselines.dedicated import planned_iteration_s
from rollmux.coordinator.policy.optimum import optimal_partition
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.registry import create_policy
from rollmux.coordinator.policy.state import ClusterState
from rollmux.core.model import ClusterSpec, Pool
from rollmux.testing.builders import make_job


def place_all(policy, jobs, state=None):  # noqa: ANN001, ANN201
    state = state or ClusterState()
    for j in jobs:
        state.apply(j, policy.place(j, state))
    return state


def test_baselines_register_by_name() -> None:
    import rollmux.coordinator.policy.baselines  # noqa: F401

    assert isinstance(create_policy("solo-d"), SoloDPolicy)
    assert isinstance(create_policy("random", seed=3), RandomPolicy)
    assert isinstance(create_policy("most-idle"), MostIdlePolicy)


def test_solo_d_always_isolates() -> None:
    state = place_all(SoloDPolicy(), [make_job(f"j{k}", roll=100, train=100) for k in range(4)])
    assert len(state.groups) == 4
    assert state.usd_per_h == pytest.approx(4 * 8 * (1.85 + 5.28))


def test_random_is_deterministic_per_seed_and_ignores_slos() -> None:
    jobs = [make_job(f"j{k}", roll=100 + 37 * k, train=300 - 20 * k, slo=1.0) for k in range(12)]
    a = place_all(RandomPolicy(seed=1), jobs)
    b = place_all(RandomPolicy(seed=1), jobs)
    assert a.job_group == b.job_group
    assert any(len(g.members) > 1 for g in a.groups.values())  # packs jobs RollMux would keep apart (SLO 1.0)
    assert len(place_all(RollMuxPolicy(), jobs).groups) > len(a.groups)


def test_random_respects_group_size_and_host_dram() -> None:
    # 32B-class state: 3 jobs fill a training node's 2 TB (520.4 GB each), whatever the group size.
    jobs = [make_job(f"j{k}", roll_gb=490.3, train_gb=520.4) for k in range(30)]
    state = place_all(RandomPolicy(PolicyConfig(max_group_size=5), seed=0), jobs)
    for g in state.groups.values():
        assert len(g.members) <= 3
        g.check_invariants()
    state = place_all(RandomPolicy(PolicyConfig(max_group_size=2), seed=0), [make_job(f"s{k}") for k in range(20)])
    assert max(len(g.members) for g in state.groups.values()) <= 2


def test_most_idle_picks_the_idlest_group_and_its_idlest_nodes() -> None:
    state = ClusterState()
    pair = [make_job("p1", roll=100, train=100, slo=1.2), make_job("p2", roll=100, train=100, slo=1.2)]
    place_all(RollMuxPolicy(PolicyConfig(modes=False)), pair, state)  # one saturated disaggregated group
    lone = make_job("lone", roll=100, train=100)
    state.apply(lone, SoloDPolicy().place(lone, state))
    g_pair, g_lone = (state.groups[state.job_group[n]] for n in ("p1", "lone"))
    assert g_pair is not g_lone
    assert idle_fraction(g_pair) == pytest.approx(0.0) and idle_fraction(g_lone) == pytest.approx(0.5)
    decision = MostIdlePolicy().place(make_job("new", roll=500, train=500, slo=1.0), state)
    assert decision.group_id == g_lone.group_id  # no SLO check: a 1000 s job joins a 200 s one
    assert decision.strategy is Strategy.DIRECT_PACKING


def test_most_idle_opens_a_group_only_when_none_has_room() -> None:
    jobs = [make_job(f"j{k}") for k in range(7)]
    state = place_all(MostIdlePolicy(PolicyConfig(max_group_size=3)), jobs)
    assert sorted(len(g.members) for g in state.groups.values()) == [1, 3, 3]


def test_opt_policy_rebuilds_the_optimal_partition() -> None:
    jobs = [make_job("a", roll=100, train=100, slo=1.2), make_job("b", roll=100, train=100, slo=1.2),
            make_job("c", roll=300, train=60, slo=1.3, n_r=16, n_t=16), make_job("d", roll=50, train=250, slo=1.5)]
    part = optimal_partition(jobs, ClusterSpec(), PolicyConfig())
    state = place_all(OptPolicy(part), jobs)
    assert state.usd_per_h == pytest.approx(part.usd_per_h)
    assert len(state.groups) == len(part.groups)


def test_colocate_runs_everything_on_the_training_gpus_at_h800_bandwidth() -> None:
    alloc = colocated(make_job(roll=100, train=100), ClusterSpec())
    assert (alloc.rollout_gpus, alloc.train_gpus, alloc.rollout_pool) == (0, 8, Pool.TRAIN)
    assert alloc.roll_factor == pytest.approx(4.0 / 3.35) and alloc.train_factor == 1.0
    assert alloc.usd_per_h == pytest.approx(8 * 5.28)


def test_gavel_plus_takes_the_cheapest_per_iteration_allocation_within_the_slo() -> None:
    cluster = ClusterSpec()
    balanced = make_job(roll=100, train=100, slo=1.5)
    pick = gavel_plus(balanced, cluster)
    assert planned_iteration_s(balanced, pick) <= 1.5 * 200
    assert pick.usd_per_h * planned_iteration_s(balanced, pick) < solo_d_allocation(balanced, cluster).usd_per_h * 200
    # With no slack, only the job's own disaggregated pools meet the SLO.
    tight = make_job(roll=100, train=100, slo=1.0)
    assert gavel_plus(tight, cluster).label == solo_d_allocation(tight, cluster).label


@pytest.mark.parametrize(("roll", "train", "slo", "label"), [
    (200, 25, 2.0, "colocated 8xH20"),  # (200 + 6.7 x 25) / 225 = 1.63 <= 2: H20-only is cheapest per iteration
    (150, 37.5, 2.0, "colocated 8xH800"),  # H20 training would be 2.1x solo: over the SLO
    (100, 100, 1.0, "disagg 8xH20+8xH800"),
], ids=["rollout-heavy-on-h20", "h20-training-too-slow", "no-slack"])
def test_gavel_plus_keeps_the_jobs_gpu_counts_and_picks_a_type(roll: float, train: float, slo: float,
                                                                label: str) -> None:
    cluster = ClusterSpec()
    job = make_job(roll=roll, train=train, slo=slo)
    pick = gavel_plus(job, cluster)
    assert pick.label == label
    assert pick.rollout_gpus + pick.train_gpus <= 16 and planned_iteration_s(job, pick) <= slo * (roll + train)
    if pick.rollout_pool is Pool.ROLLOUT and not pick.crosses_link:  # all on H20: rollout at its own speed
        assert pick.roll_factor == pytest.approx(1.0) and pick.train_factor == pytest.approx(989.5 / 148)


def test_colocated_rollout_does_not_speed_up_beyond_the_jobs_rollout_gpus() -> None:
    job = make_job(roll=100, train=100)
    wide = colocated(job, ClusterSpec(), Pool.ROLLOUT, 16)
    assert wide.roll_factor == pytest.approx(1.0) and wide.train_factor == pytest.approx(989.5 / 148 / 2)
