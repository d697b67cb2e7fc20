"""Run several policies on one trace: shared draws, one `PolicyRun` and summary per policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.api import PolicyRun, ProgressFn, SimContext, TraceJob
from rollmux.coordinator.sim.metrics import PolicySummary, summarize
from rollmux.coordinator.sim.runtime import RuntimeConfig, draw_job
from rollmux.coordinator.sim.strategies import DEFAULT_POLICIES, make_strategy
from rollmux.coordinator.sim.trace import to_job_specs
from rollmux.core.model import ClusterSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationResult:
    runs: dict[str, PolicyRun]
    summaries: dict[str, PolicySummary]


def build_context(trace: Sequence[TraceJob], cluster: ClusterSpec | None = None, runtime: RuntimeConfig | None = None,
                  max_group_size: int = 5, seed: int = 0, record_intervals: bool = True,
                  policy_config: PolicyConfig | None = None) -> SimContext:
    cluster = cluster or ClusterSpec()
    runtime = runtime or RuntimeConfig()
    draws = {j.job_id: draw_job(j, runtime, seed, cluster.gpus_per_node) for j in trace}
    return SimContext(cluster=cluster, runtime=runtime, draws=draws, max_group_size=max_group_size, seed=seed,
                      record_intervals=record_intervals, policy_config=policy_config)


def simulate(trace: Sequence[TraceJob], policies: Sequence[str] = DEFAULT_POLICIES, *,
             ctx: SimContext | None = None,
             progress: Callable[[str], ProgressFn] | None = None) -> SimulationResult:
    """Every policy in `policies` on `trace` with the same phase-time draws.

    Args:
        progress: policy name -> callback advanced once per job arrival (e.g. a progress bar task).

    Raises:
        SimError: an unknown policy or `opt` on a trace that is too large (before anything runs).
        TraceError: a job that cannot run on the cluster.
    """
    ctx = ctx or build_context(trace)
    specs = to_job_specs(trace, ctx.cluster)
    strategies = [make_strategy(p, list(specs.values()), ctx) for p in policies]
    runs = {s.name: s.simulate(trace, specs, ctx, progress(s.name) if progress else None) for s in strategies}
    return SimulationResult(runs=runs, summaries={n: summarize(r) for n, r in runs.items()})
