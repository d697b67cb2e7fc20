"""Building blocks of the paper's experiments, shared by the benchmark scripts.

`static_instance` is the setting of the paper's comparison with Opt (Fig. 14): a batch of jobs
known at once, placed one by one by an online policy, versus the offline optimal partition.
Cost is the provisioned $/h once every job is placed; SLO attainment is planned, i.e. each
group's round-robin schedule on worst-case times against SLO x T_solo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollmux.coordinator.policy.api import PlacementPolicy, PolicyConfig
from rollmux.coordinator.policy.baselines import MostIdlePolicy, RandomPolicy
from rollmux.coordinator.policy.intra_group import simulate_round_robin
from rollmux.coordinator.policy.optimum import optimal_partition
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.state import ClusterState
from rollmux.model import ClusterSpec, JobSpec

STATIC_POLICIES = ("rollmux", "random", "most-idle")


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticOutcome:
    usd_per_h: float
    slo_attainment: float  # planned: share of jobs whose simulated period <= SLO x T_solo


def _policy(name: str, config: PolicyConfig, seed: int) -> PlacementPolicy:
    return {"rollmux": lambda: RollMuxPolicy(config), "random": lambda: RandomPolicy(config, seed=seed),
            "most-idle": lambda: MostIdlePolicy(config)}[name]()


def planned_attainment(state: ClusterState, config: PolicyConfig) -> float:
    met = total = 0
    for group in state.groups.values():
        periods = simulate_round_robin(group.timings()).periods_s
        for name, member in group.members.items():
            total += 1
            met += periods[name] <= member.budget_s * (1 + config.slo_tolerance)
    return met / total if total else 1.0


def static_instance(jobs: Sequence[JobSpec], cluster: ClusterSpec | None = None, config: PolicyConfig | None = None,
                    policies: Sequence[str] = STATIC_POLICIES, seed: int = 0) -> dict[str, StaticOutcome]:
    """Each policy's cost and planned SLO attainment on `jobs` (resolved), plus `opt`."""
    cluster = cluster or ClusterSpec()
    config = config or PolicyConfig()
    out = {"opt": StaticOutcome(usd_per_h=optimal_partition(list(jobs), cluster, config).usd_per_h, slo_attainment=1.0)}
    for name in policies:
        policy = _policy(name, config, seed)
        state = ClusterState(cluster)
        for job in jobs:
            state.apply(job, policy.place(job, state))
        out[name] = StaticOutcome(usd_per_h=state.usd_per_h, slo_attainment=planned_attainment(state, config))
    return out
