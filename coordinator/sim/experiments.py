"""Building blocks of the paper's experiments, shared by the benchmark scripts.

`static_instance` is the setting of the paper's comparison with Opt (Fig. 14): a batch of jobs
known at once, placed one by one by an online policy, versus the offline optimal partition.
Cost is the provisioned $/h once every job is placed; SLO attainment is planned, i.e. each
group's round-robin schedule on worst-case times against SLO x T_solo.

A snapshot in $/h ignores time: a policy that packs past the SLOs (Random, Most-Idle) provisions
fewer GPUs but every job in its groups advances more slowly, so it holds them longer. In a trace
replay that slowdown is paid in full. `usd_per_work` is the static counterpart: $/h divided by
the throughput the jobs get, each counted as T_solo / T_coexec (1 = solo speed) on the planned
schedule, so it is the cost of one solo-speed job-hour of RL progress.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from rollmux.coordinator.policy import modes
from rollmux.coordinator.policy.api import PlacementPolicy, PolicyConfig
from rollmux.coordinator.policy.baselines import MostIdlePolicy, RandomPolicy
from rollmux.coordinator.policy.intra_group import MemberTiming, member_periods
from rollmux.coordinator.policy.optimum import OptimalPartition, optimal_partition
from rollmux.coordinator.policy.placement import RollMuxPolicy, isolated_cost
from rollmux.coordinator.policy.state import ClusterState
from rollmux.coordinator.sim.api import PolicyRun
from rollmux.core.model import ClusterSpec, JobSpec

STATIC_POLICIES = ("rollmux", "random", "most-idle")


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticOutcome:
    usd_per_h: float
    slo_attainment: float  # planned: share of jobs whose simulated period <= SLO x T_solo
    throughput: float = 0.0  # sum over jobs of T_solo / T_coexec (planned); n when all run at solo speed

    @property
    def usd_per_work(self) -> float:
        """$ per solo-speed job-hour: provisioned $/h over the throughput the jobs get."""
        return self.usd_per_h / self.throughput if self.throughput > 0 else float("inf")


def _policy(name: str, config: PolicyConfig, seed: int) -> PlacementPolicy:
    return {"rollmux": lambda: RollMuxPolicy(config), "random": lambda: RandomPolicy(config, seed=seed),
            "most-idle": lambda: MostIdlePolicy(config)}[name]()


def planned_attainment(state: ClusterState, config: PolicyConfig) -> float:
    return _planned(state, config)[0]


def _planned(state: ClusterState, config: PolicyConfig) -> tuple[float, float]:
    """(SLO attainment, throughput) of the placed groups on their worst-case schedules."""
    met = total = 0
    throughput = 0.0
    for group in state.groups.values():
        periods = member_periods(group.timings())  # exact steady state of each member
        for name, member in group.members.items():
            total += 1
            met += periods[name] <= member.budget_s * (1 + config.slo_tolerance)
            throughput += member.spec.t_solo_s / periods[name]
    return (met / total if total else 1.0), throughput


def _partition_throughput(partition: OptimalPartition, jobs: Sequence[JobSpec], cluster: ClusterSpec) -> float:
    by_name = {j.name: j for j in jobs}
    total = 0.0
    for g in partition.groups:
        train_gpus = g.train_nodes * cluster.gpus_per_node
        members = [by_name[n] for n in g.jobs]
        timings = [MemberTiming(name=j.name, t_roll_s=j.t_roll_s, t_train_s=j.t_train_s * modes.train_stretch(j, train_gpus),  # type: ignore[arg-type, operator]
                                rollout_nodes=g.pinning[j.name], train_nodes=g.train_pinning[j.name]) for j in members]
        periods = member_periods(timings)
        total += sum(j.t_solo_s / periods[j.name] for j in members)
    return total


def static_instance(jobs: Sequence[JobSpec], cluster: ClusterSpec | None = None, config: PolicyConfig | None = None,
                    policies: Sequence[str] = STATIC_POLICIES, seed: int = 0) -> dict[str, StaticOutcome]:
    """Each policy's cost and planned SLO attainment on `jobs` (resolved), plus `opt`."""
    cluster = cluster or ClusterSpec()
    config = config or PolicyConfig()
    opt = optimal_partition(list(jobs), cluster, config)
    out = {"opt": StaticOutcome(usd_per_h=opt.usd_per_h, slo_attainment=1.0,
                                throughput=_partition_throughput(opt, jobs, cluster))}
    for name in policies:
        policy = _policy(name, config, seed)
        state = ClusterState(cluster)
        for job in jobs:
            state.apply(job, policy.place(job, state))
        attainment, throughput = _planned(state, config)
        out[name] = StaticOutcome(usd_per_h=state.usd_per_h, slo_attainment=attainment, throughput=throughput)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CostBreakdown:
    """Why a trace replay saves less than a static batch: Solo-D / RollMux total $ split into factors.

    solo_over_rollmux = packing / occupancy, where `packing` compares, over RollMux's own job
    lifetimes, what the same jobs would pay on their own pools with what RollMux provisions, and
    `occupancy` is how much longer the jobs hold GPUs under RollMux than alone (their slowdown,
    weighted by price). `fresh_packing` re-packs the jobs active at sample times from scratch
    (what a static batch of that size would save); fresh_packing / packing is the cost of placing
    jobs online as they arrive and never regrouping them after departures.
    """

    solo_over_rollmux: float  # Solo-D total $ / RollMux total $
    packing: float  # sum_j iso$/h_j x JCT_j(RollMux) / RollMux total $
    occupancy: float  # sum_j iso$/h_j x JCT_j(RollMux) / sum_j iso$/h_j x JCT_j(Solo-D)
    fresh_packing: float  # at sample times: isolated $/h of the active jobs / a fresh RollMux packing of them
    online_loss: float  # fresh_packing / packing at the same sample times


def cost_breakdown(rollmux: PolicyRun, solo: PolicyRun, specs: dict[str, JobSpec], cluster: ClusterSpec | None = None,
                   config: PolicyConfig | None = None, sample_every_s: float = 86400.0) -> CostBreakdown:
    """Decompose Solo-D's cost over RollMux's on one trace (both runs on the same jobs)."""
    cluster = cluster or ClusterSpec()
    config = config or PolicyConfig()
    iso = {j: isolated_cost(s, cluster) for j, s in specs.items()}
    rm_total = _total_usd(rollmux)
    solo_jobs = {o.job_id: o for o in solo.jobs}
    held_rm = sum(iso[o.job_id] * (o.finish_s - o.arrival_s) for o in rollmux.jobs) / 3600.0
    held_solo = sum(iso[o.job_id] * (solo_jobs[o.job_id].finish_s - o.arrival_s) for o in rollmux.jobs) / 3600.0
    pts = sorted(rollmux.timeline, key=lambda p: p.t_s)
    times = [p.t_s for p in pts]
    actual = fresh = iso_sum = 0.0
    t = times[0] + sample_every_s
    end = max(o.finish_s for o in rollmux.jobs)
    while t < end:
        active = [o.job_id for o in rollmux.jobs if o.arrival_s <= t < o.finish_s]
        if len(active) >= 2:
            k = bisect.bisect_right(times, t) - 1
            state, policy = ClusterState(cluster), RollMuxPolicy(config)
            for j in sorted(active, key=lambda j: (specs[j].name)):
                state.apply(specs[j], policy.place(specs[j], state))
            actual += pts[k].usd_per_h
            fresh += state.usd_per_h
            iso_sum += sum(iso[j] for j in active)
        t += sample_every_s
    return CostBreakdown(solo_over_rollmux=_total_usd(solo) / rm_total, packing=held_rm / rm_total,
                         occupancy=held_rm / held_solo, fresh_packing=iso_sum / fresh if fresh else 1.0,
                         online_loss=(iso_sum / fresh) / (iso_sum / actual) if fresh and actual else 1.0)


def _total_usd(run: PolicyRun) -> float:
    pts = sorted(run.timeline, key=lambda p: p.t_s)
    end = max(o.finish_s for o in run.jobs)
    edges = [p.t_s for p in pts] + [end]
    return sum(p.usd_per_h * (b - a) for p, a, b in zip(pts, edges, edges[1:])) / 3600.0
