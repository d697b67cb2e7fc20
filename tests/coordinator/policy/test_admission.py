"""Admission with lookahead (`policy.admission.place_pending`): jobs pending together are placed together."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.admission import (
    LOOKAHEAD_PLACEMENTS,
    horizon,
    place_pending,
    placements_needed,
)
from rollmux.coordinator.policy.optimum import optimal_partition
from rollmux.core.model import Deployment
from rollmux.testing.builders import make_job


def _pending() -> list:
    """Three 32-GPU jobs: one by one, the first is cheapest co-located alone on its training nodes
    (which no other job can share) and the others go alone too; pending together, one disaggregated
    group carries all three, the offline optimum's partition."""
    return [make_job("a", roll=167, train=47, slo=1.2, n_r=32, n_t=32),
            make_job("b", roll=170, train=328, slo=1.95, n_r=32, n_t=32),
            make_job("c", roll=238, train=549, slo=1.66, n_r=32, n_t=32)]


def _admit(jobs: list, config: PolicyConfig, lookahead: bool) -> ClusterState:
    state, policy = ClusterState(), RollMuxPolicy(config)
    for i, job in enumerate(jobs):
        state.apply(job, place_pending(policy, job, state, jobs[i + 1:] if lookahead else ()))
    return state


def test_the_first_job_opens_a_group_the_pending_ones_can_share() -> None:
    config = PolicyConfig(work_aware=True, best_move=True)
    jobs = _pending()
    alone = _admit(jobs, config, lookahead=False)
    ahead = _admit(jobs, config, lookahead=True)
    assert RollMuxPolicy(config).place(jobs[0], ClusterState()).deployment is Deployment.COLOCATED_TRAIN
    assert ahead.usd_per_h < alone.usd_per_h
    assert ahead.usd_per_h == pytest.approx(optimal_partition(jobs, None, config).usd_per_h)


def test_lookahead_leaves_the_state_as_it_was() -> None:
    jobs = _pending()
    policy = RollMuxPolicy(PolicyConfig())
    state = ClusterState()
    state.apply(jobs[0], policy.place(jobs[0], state))
    before = (state.snapshot(), dict(state.job_group), dict(state.node_group), state.usd_per_h)
    place_pending(policy, jobs[1], state, jobs[2:])
    assert (state.snapshot(), dict(state.job_group), dict(state.node_group), state.usd_per_h) == before
    alone = policy.alone_options(jobs[1], state.cluster)[0]
    assert state.apply(jobs[1], alone).group_id == "g1"  # group ids go on where they were


@pytest.mark.parametrize("config", [PolicyConfig(lookahead_jobs=0), PolicyConfig()], ids=["off", "nothing-pending"])
def test_without_lookahead_it_is_the_policys_own_decision(config: PolicyConfig) -> None:
    jobs = _pending()
    policy = RollMuxPolicy(config)
    upcoming = jobs[1:] if config.lookahead_jobs == 0 else []
    assert place_pending(policy, jobs[0], ClusterState(), upcoming) == policy.place(jobs[0], ClusterState())


def test_a_fixed_mode_is_kept_by_every_choice() -> None:
    jobs = [replace(j, deployment=Deployment.COLOCATED_TRAIN) for j in _pending()]
    policy = RollMuxPolicy(PolicyConfig())
    assert place_pending(policy, jobs[0], ClusterState(), jobs[1:]).deployment is Deployment.COLOCATED_TRAIN



def test_lookahead_on_nodes_named_like_its_own_new_ones() -> None:
    # The live state's nodes are named by their sidecars ("r0", "t0"...): a lookahead that scales a
    # group by new rollout nodes in its scratch forks must not name them like the group's own.
    policy = RollMuxPolicy(PolicyConfig(modes=False))
    state = ClusterState()
    names = {"rollout": iter(f"r{i}" for i in range(64)), "train": iter(f"t{i}" for i in range(64))}
    first = make_job("a", roll=100, train=50, slo=2.0)
    state.apply(first, policy.place(first, state), allocate=lambda pool, n: [next(names[pool.value]) for _ in range(n)])
    pending = [make_job(name, roll=100, train=50, slo=2.0) for name in "bcd"]
    decision = place_pending(policy, pending[0], state, pending[1:])
    assert decision.group_id == "g0"
    assert set(state.node_group) == {"r0", "t0"}


@pytest.mark.parametrize(("choices", "pending"), [(1, 8), (3, 7), (7, 8), (7, 2), (7, 1), (40, 8)],
                         ids=["one-choice", "few-choices", "many-choices", "two-pending", "one-pending", "huge"])
def test_the_lookahead_horizon_keeps_its_placements_within_the_cap(choices: int, pending: int) -> None:
    n = horizon(choices, pending)
    assert 1 <= n <= pending
    assert n == 1 or placements_needed(choices, n) <= LOOKAHEAD_PLACEMENTS
    # the longest horizon that fits: one more pending job would break the cap
    assert n == pending or placements_needed(choices, n + 1) > LOOKAHEAD_PLACEMENTS
