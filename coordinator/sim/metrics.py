"""Summary metrics of a `PolicyRun`, and the JSON document other tools read.

Cost is integrated over the run's own span (first arrival to last completion), so a policy that
slows jobs down pays for the longer occupancy. Bubble fraction of a pool is the share of its
provisioned GPU-time no phase ran on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollmux.coordinator.sim.api import PolicyRun


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySummary:
    policy: str
    avg_cost_per_hour: float  # $/h averaged over the span
    peak_cost_per_hour: float
    total_usd: float
    span_h: float  # first arrival to last completion
    peak_gpus_rollout: int
    peak_gpus_train: int
    # SLO attainment, two ways (README "Simulator"): the paper's T_solo is the profiled worst case
    # that admission plans with, which RollMux guarantees; the realised solo iteration (same draws,
    # alone on its own pools) is stricter, since phases shrink unevenly at runtime.
    slo_attainment: float  # share of jobs with mean iteration <= SLO x realised solo iteration
    slo_attainment_planned: float  # share with mean iteration <= SLO x worst-case T_solo (paper's definition)
    bubble_rollout: float  # idle share of provisioned rollout GPU-time
    bubble_train: float
    mean_jct_h: float  # mean job completion time (arrival to last iteration)
    mean_slowdown: float  # mean iteration over solo iteration, averaged over jobs
    p95_slowdown: float
    jobs: int
    wall_s: float  # real time the policy's simulation took

    def as_json(self, rollmux_cost: float | None) -> dict[str, Any]:
        return {
            "avg_cost_per_hour": self.avg_cost_per_hour,
            "peak_cost_per_hour": self.peak_cost_per_hour,
            "total_usd": self.total_usd,
            "span_h": self.span_h,
            "slo_attainment": self.slo_attainment,
            "slo_attainment_planned": self.slo_attainment_planned,
            "peak_gpus": {"rollout": self.peak_gpus_rollout, "train": self.peak_gpus_train},
            "bubble_fraction": {"rollout": self.bubble_rollout, "train": self.bubble_train},
            "mean_jct_h": self.mean_jct_h,
            "mean_slowdown": self.mean_slowdown,
            "p95_slowdown": self.p95_slowdown,
            "jobs": self.jobs,
            "wall_s": self.wall_s,
            "cost_ratio_vs_rollmux": (self.avg_cost_per_hour / rollmux_cost) if rollmux_cost else None,
        }


def _integrate(times: np.ndarray, values: np.ndarray, end: float) -> float:
    edges = np.append(times, end)
    return float(np.sum(values * np.diff(edges)))


def summarize(run: PolicyRun) -> PolicySummary:
    """Metrics of one run (the timeline is piecewise constant between its points)."""
    start = min(j.arrival_s for j in run.jobs)
    end = max(j.finish_s for j in run.jobs)
    pts = sorted(run.timeline, key=lambda p: p.t_s)
    times = np.array([p.t_s for p in pts])
    usd = np.array([p.usd_per_h for p in pts])
    roll = np.array([p.rollout_gpus for p in pts], dtype=float)
    train = np.array([p.train_gpus for p in pts], dtype=float)
    span_s = max(end - start, 1e-9)
    total = _integrate(times, usd, end) / 3600.0
    prov_r = _integrate(times, roll, end)
    prov_t = _integrate(times, train, end)
    slow = np.array([j.slowdown for j in run.jobs])
    return PolicySummary(
        policy=run.policy, avg_cost_per_hour=total / (span_s / 3600.0), peak_cost_per_hour=float(usd.max()),
        total_usd=total, span_h=span_s / 3600.0, peak_gpus_rollout=int(roll.max()), peak_gpus_train=int(train.max()),
        slo_attainment=float(np.mean([j.slo_met for j in run.jobs])),
        slo_attainment_planned=float(np.mean([j.planned_slo_met for j in run.jobs])),
        bubble_rollout=1.0 - run.busy_gpu_s["rollout"] / prov_r if prov_r > 0 else 0.0,
        bubble_train=1.0 - run.busy_gpu_s["train"] / prov_t if prov_t > 0 else 0.0,
        mean_jct_h=float(np.mean([j.finish_s - j.arrival_s for j in run.jobs])) / 3600.0,
        mean_slowdown=float(slow.mean()), p95_slowdown=float(np.percentile(slow, 95)), jobs=len(run.jobs),
        wall_s=run.wall_s)


def to_json(summaries: Sequence[PolicySummary], meta: dict[str, Any]) -> dict[str, Any]:
    """`{"policies": {name: {...}}, "reference": "rollmux", ...meta}`."""
    by_name = {s.policy: s for s in summaries}
    ref = by_name.get("rollmux")
    ref_cost = ref.avg_cost_per_hour if ref else None
    return {"policies": {s.policy: s.as_json(ref_cost) for s in summaries},
            "reference": "rollmux" if ref else None, **meta}
