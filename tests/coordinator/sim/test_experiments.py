from __future__ import annotations

import pytest

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.experiments import static_instance
from rollmux.core.model import ClusterSpec
from rollmux.testing.builders import make_job


def test_a_lone_job_gets_solo_throughput_and_work_cost_equals_its_price() -> None:
    res = static_instance([make_job(roll=100, train=100)], ClusterSpec(), PolicyConfig(modes=False))
    for name in ("opt", "rollmux", "random", "most-idle"):
        assert res[name].throughput == pytest.approx(1.0)
        assert res[name].usd_per_work == pytest.approx(res[name].usd_per_h)


def test_packing_past_the_slo_is_cheap_per_hour_but_not_per_unit_of_work() -> None:
    # Three rollout-heavy jobs with tight SLOs: Opt keeps them apart, Most-Idle (no SLO check)
    # stacks them on one rollout node and slows every one of them down.
    jobs = [make_job(f"j{k}", roll=300, train=60, slo=1.1) for k in range(3)]
    res = static_instance(jobs, ClusterSpec(), PolicyConfig())
    assert res["most-idle"].usd_per_h < res["opt"].usd_per_h
    assert res["most-idle"].throughput < 0.5 * res["opt"].throughput
    assert res["most-idle"].usd_per_work > res["opt"].usd_per_work
    assert res["rollmux"].usd_per_work == pytest.approx(res["opt"].usd_per_work)


def test_cost_breakdown_factors_multiply_to_the_measured_ratio() -> None:
    from rollmux.coordinator.sim.engine import build_context, simulate
    from rollmux.coordinator.sim.experiments import cost_breakdown
    from rollmux.coordinator.sim.trace import to_job_specs
    from rollmux.coordinator.sim.workload import generate

    trace = generate("mixed", 30, seed=3)
    trace = [type(j)(**{**{f: getattr(j, f) for f in j.__dataclass_fields__}, "iterations": min(j.iterations, 30)})
             for j in trace]
    ctx = build_context(trace, seed=3, record_intervals=False)
    res = simulate(trace, ["rollmux", "solo-d"], ctx=ctx)
    b = cost_breakdown(res.runs["rollmux"], res.runs["solo-d"], to_job_specs(trace, ctx.cluster), ctx.cluster,
                       sample_every_s=600.0)
    assert b.solo_over_rollmux == pytest.approx(res.summaries["solo-d"].total_usd / res.summaries["rollmux"].total_usd)
    assert b.solo_over_rollmux == pytest.approx(b.packing / b.occupancy)
    assert b.occupancy >= 1.0 and b.packing >= 1.0 and b.fresh_packing >= 1.0
