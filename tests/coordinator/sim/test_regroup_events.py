"""When the simulator looks for relocations: after learning events, and a pool merge survivor's return."""

from __future__ import annotations

from dataclasses import replace

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.engine import build_context, simulate
from rollmux.coordinator.sim.workload import generate

from .builders import trace_job


def _run(trace, seed: int = 0, **cfg):  # noqa: ANN001, ANN202
    config = PolicyConfig(**{"work_aware": True, "best_move": True, **cfg})  # the simulator's defaults
    ctx = build_context(trace, seed=seed, record_intervals=False, policy_config=config)
    res = simulate(trace, ["rollmux"], ctx=ctx)
    return res.runs["rollmux"], res.summaries["rollmux"]


def test_two_lone_jobs_pair_up_once_the_newcomers_times_are_learned() -> None:
    # At b's arrival its worst-case times keep the pair over a's learned budget; five iterations
    # later its learned times fit, and only a look at that learning event finds the merge.
    trace = [trace_job("a", iterations=150, roll=100, train=150, slo=1.2),
             trace_job("b", arrival=3000, iterations=150, roll=100, train=150, slo=1.2)]
    on, on_summary = _run(trace)
    off, off_summary = _run(trace, regroup_on_learn=False)
    assert off.relocations == 0 and on.relocations == 2
    assert {j.group_id for j in on.jobs} == {"g2"}  # both end in the pair's group
    assert on_summary.total_usd < 0.8 * off_summary.total_usd
    assert on_summary.slo_attainment_planned == 1.0 and on_summary.slo_attainment == 1.0


def test_a_pool_merge_survivor_takes_the_return_move_the_merge_priced_in() -> None:
    # Seeded train-heavy trace (20 jobs, seed 0) with a cap of one move per job: every pool merge's
    # survivor has used its move when its partner ends, and only the return move lets it leave.
    trace = [replace(j, elastic=True) for j in generate("train-heavy", 20, 0, "U(1,2)")]  # pool merges need elastic jobs
    on, on_summary = _run(trace, max_moves_per_job=1)
    off, off_summary = _run(trace, max_moves_per_job=1, pool_return=False)
    assert on.relocations > off.relocations
    assert on_summary.total_usd < off_summary.total_usd
    assert on_summary.slo_attainment_planned == 1.0 and on_summary.slo_attainment == 1.0


def test_the_per_job_move_cap_is_the_policys() -> None:
    trace = [trace_job("a", iterations=150, roll=100, train=150, slo=1.2),
             trace_job("b", arrival=3000, iterations=150, roll=100, train=150, slo=1.2)]
    capped, _ = _run(trace, max_moves_per_job=0)
    assert capped.relocations == 0
