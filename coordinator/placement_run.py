"""Place a list of jobs one by one with a policy and summarise the result (used by `rollmux place`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollmux.coordinator.policy import ClusterState, PlacementDecision, PolicyConfig
from rollmux.coordinator.policy.intra_group import cycle_time
from rollmux.coordinator.policy.placement import isolated_cost
from rollmux.coordinator.policy.profiler import resolve
from rollmux.coordinator.policy.registry import create_policy
from rollmux.coordinator.policy.regroup import Move, place_batch
from rollmux.core.model import ClusterSpec, JobSpec


def _job(name: str, params_b: float, max_tokens: int, batch: int, n_t: int, n_r: int, turns: int,
         slo: float) -> JobSpec:
    return JobSpec(name=name, model_params_b=params_b, max_tokens=max_tokens, batch_size=batch,
                   n_train_gpus=n_t, n_rollout_gpus=n_r, turns=turns, slo=slo)


# The paper's Table 3 job types, a few of each, with a spread of SLOs. Phase times come from the
# profiler (worst case), state per node from Table 2.
BUILTIN_MIX: tuple[JobSpec, ...] = (
    _job("A1-qwen7b-8k", 7, 8192, 256, 8, 8, 1, 1.5),
    _job("A2-qwen7b-8k", 7, 8192, 256, 8, 8, 1, 1.5),
    _job("B1-qwen14b-8k", 14, 8192, 256, 8, 8, 1, 1.3),
    _job("C1-qwen32b-8k", 32, 8192, 256, 16, 16, 1, 1.5),
    _job("D1-qwen8b-multiturn", 8, 2048, 256, 8, 8, 4, 1.5),
    _job("D2-qwen8b-multiturn", 8, 2048, 256, 8, 8, 4, 1.8),
    _job("E1-qwen14b-multiturn", 14, 4096, 64, 8, 8, 4, 2.0),
    _job("B2-qwen14b-8k", 14, 8192, 256, 8, 8, 1, 1.2),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRun:
    decisions: tuple[PlacementDecision, ...]
    moves: tuple[Move, ...]  # relocations regrouping made after the placements (docs/design/policy.md)
    groups: tuple[dict[str, Any], ...]  # one summary per group (ids, jobs, nodes, cost, T_cycle, T_load)
    usd_per_h: float  # total cost of all groups
    solo_usd_per_h: float  # dedicated pools: each job on its own N_R + N_T GPUs
    all_within_slo: bool  # every member's simulated period <= SLO x T_solo

    def to_json(self) -> dict[str, Any]:
        return {
            "usd_per_h": self.usd_per_h,
            "solo_usd_per_h": self.solo_usd_per_h,
            "all_within_slo": self.all_within_slo,
            "groups": list(self.groups),
            "decisions": [{"job": d.job, "strategy": d.strategy.value, "group": d.group_id,
                           "deployment": d.deployment.value, "delta_usd_per_h": d.delta_usd_per_h,
                           "reason": d.reason, "rejections": [str(r) for r in d.rejections]} for d in self.decisions],
            "moves": [{"job": m.job, "from_group": m.from_group, "deployment": m.decision.deployment.value,
                       "saving_usd_per_h": m.saving_usd_per_h, "reason": m.reason} for m in self.moves],
        }


def run_placement(jobs: Sequence[JobSpec], cluster: ClusterSpec, *, max_group_size: int = 5,
                  policy_name: str = "rollmux") -> PlacementRun:
    """Resolve each job with the profiler, place it, apply the decision; then summarise."""
    policy = create_policy(policy_name, config=PolicyConfig(max_group_size=max_group_size))
    state = ClusterState(cluster)
    resolved = [resolve(j, cluster) for j in jobs]
    decisions, moves = place_batch(resolved, state, policy)
    groups = []
    within = True
    for g in state.groups.values():
        period = cycle_time(g.timings())  # exact steady state; every member shares it
        periods = dict.fromkeys(g.members, period)
        within &= all(period <= m.budget_s * (1 + 1e-9) for m in g.members.values())
        groups.append({"group_id": g.group_id, "jobs": list(g.members), "rollout_nodes": list(g.rollout),
                       "train_nodes": list(g.train_nodes), "usd_per_h": g.usd_per_h,
                       "t_cycle_s": g.t_cycle_s, "t_load_s": g.t_load_s,
                       "t_coexec_s": periods})
    return PlacementRun(decisions=tuple(decisions), moves=tuple(moves), groups=tuple(groups), usd_per_h=state.usd_per_h,
                        solo_usd_per_h=sum(isolated_cost(j, cluster) for j in resolved), all_within_slo=within)
