"""Which relocation the regroup plan takes (`PolicyConfig.best_move`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.regroup import plan_moves
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
