"""The offline optimum for small instances: the cheapest partition of a job set into groups.

All jobs are known and present at once. A group's cheapest configuration has max(N_T) training
GPUs (each member trains on its own N_T of them, pinned to training nodes like its rollout to
rollout nodes, so fixed-world-size jobs on disjoint nodes train side by side; or on all when
elastic) and uses the fewest rollout nodes for which some pinning of
its jobs keeps every node's DRAM within capacity and every member within its SLO under the
round-robin schedule on per-node queues (the same simulation as the online policy). Group costs are memoised per subset; subsets whose
sub-subset is infeasible are skipped (removing a job never lengthens anyone's period nor adds
state), and a dynamic programme over bitmasks picks the cheapest partition.

With deployment modes on (`PolicyConfig.modes`), a job alone costs its cheapest feasible lone
mode (disaggregated, or co-located on training- or rollout-pool GPUs), as the online policy's new
groups do; groups of several jobs are disaggregated. Co-located members inside groups are outside
this search, so the online policy can land below it.

Exponential by nature: refuse more than `MAX_OPT_JOBS` jobs with a clear error.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from rollmux.coordinator.policy import modes
from rollmux.coordinator.policy.api import PolicyConfig, PolicyError
from rollmux.coordinator.policy.intra_group import MemberTiming, member_periods
from rollmux.core.model import ClusterSpec, Deployment, JobSpec, Pool

MAX_OPT_JOBS = 14


class InstanceTooLargeError(PolicyError):
    """The offline optimum was asked for an instance it cannot solve in reasonable time."""


class SearchBudgetError(PolicyError):
    """The search took more pinning steps than its caller's budget allowed (an online caller's bound)."""


CHECK_STEPS = 20
"""Steps one schedule check (a full pinning's `member_periods`) counts for: it costs about that many
pinning steps."""


class _Budget:
    """Pinning steps left to one `optimal_partition` call (None: unbounded)."""

    __slots__ = ("left",)

    def __init__(self, steps: int | None) -> None:
        self.left = steps

    def spend(self, steps: int = 1) -> None:
        if self.left is not None:
            self.left -= steps
            if self.left < 0:
                raise SearchBudgetError("the partition search ran past its step budget")


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimalGroup:
    jobs: tuple[str, ...]
    rollout_nodes: int
    train_nodes: int
    pinning: dict[str, tuple[int, ...]]  # job -> rollout node indices
    train_pinning: dict[str, tuple[int, ...]]  # job -> training node indices
    usd_per_h: float


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimalPartition:
    groups: tuple[OptimalGroup, ...]
    usd_per_h: float


def _feasible_pinning(jobs: Sequence[JobSpec], train_nodes: int, m: int, cluster: ClusterSpec, config: PolicyConfig,
                      slack: float = 1.0, budget: _Budget | None = None
                      ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]] | None:
    """Depth-first search for a pinning of `jobs` on `m` rollout nodes and `train_nodes` training
    nodes: (rollout pinning, training pinning), or None if none is feasible."""
    dram = cluster.host_dram_bytes
    train_gpus = train_nodes * cluster.gpus_per_node
    need = [cluster.nodes_for(j.n_rollout_gpus) for j in jobs]
    need_t = [cluster.nodes_for(modes.world_gpus(j, cluster, Deployment.DISAGGREGATED, train_gpus)) for j in jobs]
    t_train = [j.t_train_s * modes.train_stretch(j, train_gpus) for j in jobs]  # type: ignore[operator]
    budgets = [j.slo * j.t_solo_s * (1 + config.slo_tolerance) / slack for j in jobs]
    used = [0] * m
    load = [0.0] * m
    load_t = [0.0] * train_nodes
    used_t = [0] * train_nodes
    chosen: list[tuple[int, ...]] = []
    chosen_t: list[tuple[int, ...]] = []

    def check() -> bool:
        timings = [MemberTiming(name=j.name, t_roll_s=j.t_roll_s, t_train_s=t, rollout_nodes=nodes, train_nodes=tn)  # type: ignore[arg-type]
                   for j, t, nodes, tn in zip(jobs, t_train, chosen, chosen_t)]
        periods = member_periods(timings)
        return all(periods[j.name] <= b for j, b in zip(jobs, budgets))

    def dfs(i: int, touched: int, touched_t: int) -> bool:
        if budget is not None:
            budget.spend(CHECK_STEPS if i == len(jobs) else 1)
        if i == len(jobs):
            return check()
        j = jobs[i]
        # Untouched nodes are interchangeable: only the first few of them are worth trying.
        for combo_t in itertools.combinations(range(min(train_nodes, touched_t + need_t[i])), need_t[i]):
            if any(load_t[n] + t_train[i] > min(budgets) or used_t[n] + j.train_state_bytes >= dram  # type: ignore[operator]
                   for n in combo_t):
                continue
            for n in combo_t:
                load_t[n] += t_train[i]
                used_t[n] += j.train_state_bytes  # type: ignore[operator]
            chosen_t.append(combo_t)
            for combo in itertools.combinations(range(min(m, touched + need[i])), need[i]):
                if any(used[n] + j.rollout_state_bytes >= dram for n in combo):  # type: ignore[operator]
                    continue
                if any(load[n] + j.t_roll_s > min(budgets) for n in combo):  # type: ignore[operator]
                    continue
                for n in combo:
                    used[n] += j.rollout_state_bytes  # type: ignore[operator]
                    load[n] += j.t_roll_s  # type: ignore[operator]
                chosen.append(combo)
                if dfs(i + 1, max(touched, max(combo) + 1), max(touched_t, max(combo_t) + 1)):
                    return True
                chosen.pop()
                for n in combo:
                    used[n] -= j.rollout_state_bytes  # type: ignore[operator]
                    load[n] -= j.t_roll_s  # type: ignore[operator]
            chosen_t.pop()
            for n in combo_t:
                load_t[n] -= t_train[i]
                used_t[n] -= j.train_state_bytes  # type: ignore[operator]
        return False

    if dfs(0, 0, 0):
        return {j.name: c for j, c in zip(jobs, chosen)}, {j.name: c for j, c in zip(jobs, chosen_t)}
    return None


def cheapest_group(jobs: Sequence[JobSpec], cluster: ClusterSpec, config: PolicyConfig,
                   margins: bool = False, budget: _Budget | None = None) -> OptimalGroup | None:
    """The cheapest feasible configuration of one group holding exactly `jobs`, or None.

    With `margins`, every member's period stays within its budget / (1 + the co-execution margin the
    online policy keeps for a group of this size, `placement.slo_check`), as a live group must."""
    slack = 1.0
    if margins and len(jobs) > 1:
        from rollmux.coordinator.policy.placement import BIG_GROUP

        slack += config.coexec_margin_big if len(jobs) >= BIG_GROUP else config.coexec_margin
    need = [cluster.nodes_for(j.n_rollout_gpus) for j in jobs]
    need_t = [cluster.nodes_for(j.n_train_gpus) for j in jobs]
    r_usd, t_usd = cluster.node_usd_per_h(Pool.ROLLOUT), cluster.node_usd_per_h(Pool.TRAIN)
    best: OptimalGroup | None = None
    # max(N_T) training nodes, the pool Algorithm 1 never grows. More (fixed-world-size jobs side by
    # side on their own nodes, as a pool merge leaves them) is outside the search: its pinning search
    # over the larger pools took minutes per 8-job instance, so the online policy can land below it.
    for train_nodes in range(max(need_t), max(need_t) + 1):
        if best is not None and train_nodes * t_usd + max(need) * r_usd >= best.usd_per_h:
            break
        if not _may_fit(jobs, train_nodes, cluster, config, slack):
            continue
        for m in range(max(need), sum(need) + 1):
            cost = m * r_usd + train_nodes * t_usd
            if best is not None and cost >= best.usd_per_h:
                break
            found = _feasible_pinning(jobs, train_nodes, m, cluster, config, slack, budget)
            if found is not None:
                best = OptimalGroup(jobs=tuple(j.name for j in jobs), rollout_nodes=m, train_nodes=train_nodes,
                                    pinning=found[0], train_pinning=found[1], usd_per_h=cost)
                break
    return best


def _may_fit(jobs: Sequence[JobSpec], train_nodes: int, cluster: ClusterSpec, config: PolicyConfig, slack: float) -> bool:
    """Necessary condition for `jobs` on `train_nodes` training nodes: the training node-seconds per
    iteration spread over the nodes at best, and each job's own cycle, fit the tightest budget."""
    train_gpus = train_nodes * cluster.gpus_per_node
    t_train = [j.t_train_s * modes.train_stretch(j, train_gpus) for j in jobs]  # type: ignore[operator]
    node_s = sum(t * cluster.nodes_for(modes.world_gpus(j, cluster, Deployment.DISAGGREGATED, train_gpus))
                 for j, t in zip(jobs, t_train))
    lower = max(node_s / train_nodes, max(j.t_roll_s + t for j, t in zip(jobs, t_train)))  # type: ignore[operator]
    return lower <= min(j.slo * j.t_solo_s for j in jobs) * (1 + config.slo_tolerance) / slack


def _alone(job: JobSpec, cluster: ClusterSpec, config: PolicyConfig) -> OptimalGroup:
    """The job alone in its cheapest lone mode that meets its SLO (disaggregated always does)."""
    from rollmux.coordinator.policy.placement import allowed_modes, new_group_options

    budget = job.slo * job.t_solo_s * (1 + config.slo_tolerance)
    options = [o for o in new_group_options(job, cluster, allowed_modes(job, config)) if o.planned_s <= budget]
    best = min(options, key=lambda o: o.usd_per_h, default=None)
    if best is None:  # a fixed co-located mode too slow for its SLO: the policy runs it anyway
        best = new_group_options(job, cluster, allowed_modes(job, config))[0]
    return OptimalGroup(jobs=(job.name,), rollout_nodes=best.rollout_nodes, train_nodes=best.train_nodes,
                        pinning={job.name: tuple(range(best.rollout_nodes))},
                        train_pinning={job.name: tuple(range(best.train_nodes))}, usd_per_h=best.usd_per_h)


def optimal_partition(jobs: Sequence[JobSpec], cluster: ClusterSpec | None = None,
                      config: PolicyConfig | None = None, margins: bool = False,
                      max_steps: int | None = None) -> OptimalPartition:
    """Minimum-cost partition of `jobs` (resolved) into feasible groups; with `margins`, groups keep
    the online policy's co-execution margins (`cheapest_group`), the problem a live coordinator solves.
    `max_steps` bounds the pinning search (an online caller's time bound; None: unbounded).

    Raises:
        InstanceTooLargeError: more than MAX_OPT_JOBS jobs.
        SearchBudgetError: the pinning search took more than `max_steps` steps.
    """
    cluster = cluster or ClusterSpec()
    config = config or PolicyConfig()
    n = len(jobs)
    if n > MAX_OPT_JOBS:
        raise InstanceTooLargeError(f"the offline optimum handles at most {MAX_OPT_JOBS} jobs, got {n}: "
                                    "use a smaller trace or drop 'opt' from the policies")
    if n == 0:
        return OptimalPartition(groups=(), usd_per_h=0.0)
    budget = _Budget(max_steps)
    group_of: dict[int, OptimalGroup | None] = {}
    infeasible: list[int] = []
    by_size = sorted(range(1, 1 << n), key=lambda s: bin(s).count("1"))
    for mask in by_size:
        if bin(mask).count("1") > config.max_group_size or any(mask & bad == bad for bad in infeasible):
            continue
        members = [jobs[i] for i in range(n) if mask >> i & 1]
        g = cheapest_group(members, cluster, config, margins, budget) if len(members) > 1 else _alone(members[0], cluster, config)
        group_of[mask] = g
        if g is None:
            infeasible.append(mask)
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for mask in range(1, 1 << n):
        low = mask & -mask
        rest = mask ^ low
        choice: tuple[float, tuple[int, ...]] | None = None
        sub = rest
        while True:
            grp = sub | low
            g = group_of.get(grp)
            if g is not None:
                cost = g.usd_per_h + best[mask ^ grp][0]
                if choice is None or cost < choice[0]:
                    choice = (cost, (grp, *best[mask ^ grp][1]))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        assert choice is not None, "every single job is feasible alone"
        best[mask] = choice
    total, masks = best[(1 << n) - 1]
    return OptimalPartition(groups=tuple(group_of[m] for m in masks), usd_per_h=total)  # type: ignore[misc]
