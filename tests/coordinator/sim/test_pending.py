"""The simulator admits jobs that arrive at the same instant together (`policy.admission.place_pending`)."""

from __future__ import annotations

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.engine import build_context, simulate

from .builders import trace_job

# Three 32-GPU jobs arriving together: one by one the later two each go alone; pending together, the
# second opens a group the third shares (tests/coordinator/policy/test_admission.py has the same three).
TRACE = [trace_job("a", roll=167, train=47, slo=1.2, gpus=32, iterations=40),
         trace_job("b", roll=170, train=328, slo=1.95, gpus=32, iterations=40),
         trace_job("c", roll=238, train=549, slo=1.66, gpus=32, iterations=40)]


def _run(lookahead_jobs: int):  # noqa: ANN202
    config = PolicyConfig(work_aware=True, best_move=True, lookahead_jobs=lookahead_jobs, learn=False,
                          regroup=False)  # the admission alone (regrouping after each arrival would mend it)
    ctx = build_context(TRACE, seed=0, record_intervals=False, policy_config=config)
    res = simulate(TRACE, ["rollmux"], ctx=ctx)
    return res.runs["rollmux"], res.summaries["rollmux"]


def test_jobs_arriving_together_are_placed_together() -> None:
    ahead, ahead_summary = _run(8)
    alone, alone_summary = _run(0)
    admitted = [p.usd_per_h for p in ahead.timeline if p.t_s == 0.0][-1]
    one_by_one = [p.usd_per_h for p in alone.timeline if p.t_s == 0.0][-1]
    assert admitted < one_by_one
    assert ahead_summary.total_usd < alone_summary.total_usd
    assert ahead_summary.slo_attainment_planned == 1.0
