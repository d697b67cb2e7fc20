"""Which relocation the regroup plan takes (`PolicyConfig.best_move`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.regroup import apply_moves, plan_moves
from rollmux.testing.builders import make_job

REMAINING_S = 1e7


def _lone_pair(config: PolicyConfig) -> tuple[ClusterState, RollMuxPolicy]:
    state, policy = ClusterState(), RollMuxPolicy(config)
    for name in ("a", "b"):  # elastic: a pool merge may stretch their Trains over both training nodes
        job = replace(make_job(name, roll=40, train=160, slo=1.5), elastic=True)
        state.apply(job, policy.place(job, state))
    return state, policy


def _gain(moves) -> float:  # noqa: ANN001
    return moves[0].saving_usd_per_h * REMAINING_S if moves else 0.0


@pytest.mark.parametrize("best_move", [True, False], ids=["best", "first-that-pays"])
def test_the_best_move_saves_at_least_what_the_first_that_pays_saves(best_move: bool) -> None:
    state, policy = _lone_pair(PolicyConfig(best_move=best_move))
    moves = plan_moves(state, policy, ["b"], lambda _: REMAINING_S)
    assert moves, "two lone train-heavy jobs: some move pays"
    first_state, first_policy = _lone_pair(PolicyConfig(best_move=False))
    first = plan_moves(first_state, first_policy, ["b"], lambda _: REMAINING_S)
    assert _gain(moves) >= _gain(first) - 1e-9


@pytest.mark.parametrize(("pull", "in_plan"), [(True, True), (False, True), (True, False)],
                         ids=["pull", "pull-moves-off", "arrival-plan"])
def test_a_lone_job_is_pulled_into_a_group_a_member_left(pull: bool, in_plan: bool) -> None:
    """x could not join a, b, c (its tighter SLO); once c leaves, x joins a and b (pull move),
    which releases x's whole group; without pull moves, or in a plan that asks for none (an
    arrival's), a's and b's regroup pass leaves x alone."""
    state, policy = ClusterState(), RollMuxPolicy(PolicyConfig(pull_moves=pull, learn=False, modes=False))
    for name, slo in (("a", 1.3), ("b", 1.3), ("c", 1.3), ("x", 1.1)):
        job = make_job(name, roll=100, train=40, slo=slo)
        state.apply(job, policy.place(job, state))
    shared, alone = state.job_group["a"], state.job_group["x"]
    assert shared != alone and list(state.groups[alone].members) == ["x"], "x cannot join three members"
    state.remove_job("c")
    before = state.usd_per_h
    moves = plan_moves(state, policy, list(state.groups[shared].members), lambda _: REMAINING_S, pull=in_plan)
    if not (pull and in_plan):
        assert moves == []
        return
    assert [(m.job, m.from_group, m.decision.group_id) for m in moves] == [("x", alone, shared)]
    apply_moves(state, moves)
    assert alone not in state.groups and state.job_group["x"] == shared
    assert state.usd_per_h == pytest.approx(before - moves[0].saving_usd_per_h)
