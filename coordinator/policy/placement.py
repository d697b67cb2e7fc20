"""Inter-group placement: the paper's Algorithm 1, with cached summaries and early exit.

For an arriving job, in group creation order:
  1. skip groups that are saturated, full, or whose training pool is too small;
  2. for each remaining group, try direct packing (its rollout on existing nodes, +$0/h), then
     rollout scaling with 1..k new rollout nodes (+ their price), cheapest first;
  3. reject a placement whose resident state would not fit a node's host DRAM, or whose
     simulated round-robin schedule breaks any member's SLO (a cheap lower bound on the period
     runs before the simulation and rejects most candidates without simulating);
  4. compare the best with a new isolated group; the lowest marginal $/h wins, ties to the
     existing (earlier) group.

A feasible direct packing costs nothing and ties go to the earliest group, so the first group
that admits one wins outright: later groups are recorded as not evaluated. This keeps the
decision fast at thousands of jobs without changing its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.coordinator.policy.api import (
    PlacementDecision,
    PolicyConfig,
    PolicyError,
    Rejection,
    RejectReason,
    Strategy,
    register_policy,
)
from rollmux.coordinator.policy.intra_group import MemberTiming, cycle_time
from rollmux.coordinator.policy.state import ClusterState, GroupState
from rollmux.model import ClusterSpec, JobSpec, Pool


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A concrete placement of the job into one group, before its checks."""

    group: GroupState
    existing_nodes: tuple[str, ...]  # existing rollout nodes to pin to
    new_nodes: int  # rollout nodes to add

    @property
    def strategy(self) -> Strategy:
        return Strategy.DIRECT_PACKING if self.new_nodes == 0 else Strategy.ROLLOUT_SCALING


def isolated_cost(job: JobSpec, cluster: ClusterSpec) -> float:
    """$/h of a new group holding only `job` on its own N_R + N_T GPUs (whole nodes)."""
    return (cluster.nodes_for(job.n_rollout_gpus) * cluster.node_usd_per_h(Pool.ROLLOUT)
            + cluster.nodes_for(job.n_train_gpus) * cluster.node_usd_per_h(Pool.TRAIN))


def group_prune_reason(group: GroupState, job: JobSpec, config: PolicyConfig) -> Rejection | None:
    """Step 1: reasons to skip a group before looking at any placement in it."""
    gid = group.group_id
    if not group.train_available:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.NODE_UNAVAILABLE,
                         message=f"training node(s) {','.join(sorted(group.train_unavailable))} cannot take work "
                                 "(draining, drained or lost)")
    if len(group.members) >= config.max_group_size:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.GROUP_FULL,
                         message=f"{len(group.members)} jobs = max group size {config.max_group_size}")
    if job.n_train_gpus > group.train_gpus:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.TRAIN_POOL,
                         message=f"job needs {job.n_train_gpus} training GPUs, group has {group.train_gpus}")
    assert job.train_state_bytes is not None
    if group.train_dram_used_bytes + job.train_state_bytes >= group.train_dram_bytes:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.HOST_DRAM,
                         message=f"memory on training nodes {','.join(group.train_nodes)}: "
                                 f"{(group.train_dram_used_bytes + job.train_state_bytes) / 1e9:.1f} GB "
                                 f">= {group.train_dram_bytes / 1e9:.1f} GB")
    return slo_bound_rejection(group, job, config)


def slo_bound_rejection(group: GroupState, job: JobSpec, config: PolicyConfig) -> Rejection | None:
    """Whole-group SLO pruning: no placement can beat max(T_cycle', sum T_train', node loads).

    Every member of a group shares one period, which is at least each of those loads; if that
    bound already exceeds the tightest SLO budget, no candidate in this group needs simulating.
    """
    assert job.t_roll_s is not None
    t_train = group.stretched_train_s(job)
    lower = max(group.t_cycle_s, job.t_roll_s + t_train, group.train_load_s + t_train, group.max_node_load_s)
    job_budget = job.slo * job.t_solo_s
    budget, who = (group.min_budget_s, group.min_budget_job) if group.min_budget_s < job_budget else (job_budget, job.name)
    if lower <= budget * (1.0 + config.slo_tolerance):
        return None
    spec = group.members[who].spec if who in group.members else job
    return Rejection(group_id=group.group_id, strategy=None, reason=RejectReason.SLO,
                     message=f"SLO of job {who}: at least {lower / spec.t_solo_s:.2f} > {spec.slo:.2f} "
                             "whatever the placement")


def candidates(group: GroupState, job: JobSpec, cluster: ClusterSpec) -> tuple[list[Candidate], Rejection | None]:
    """Step 2: direct packing, then rollout scaling with 1..k new nodes, cheapest first.

    Existing nodes are taken least loaded first (by the T_roll already pinned there), among those
    whose host DRAM still has room for the job's rollout state.
    """
    assert job.rollout_state_bytes is not None
    k = cluster.nodes_for(job.n_rollout_gpus)
    roomy = sorted((n for n in group.rollout.values()
                    if n.available and n.dram_used_bytes + job.rollout_state_bytes < n.host_dram_bytes),
                   key=lambda n: (n.load_s, n.node_id))
    out = [Candidate(group=group, existing_nodes=tuple(n.node_id for n in roomy[: k - s]), new_nodes=s)
           for s in range(0, k + 1) if len(roomy) >= k - s]
    memory_note = None
    if len(roomy) < k:
        full = [n.node_id for n in group.rollout.values() if n not in roomy]
        memory_note = Rejection(group_id=group.group_id, strategy=Strategy.DIRECT_PACKING,
                                reason=RejectReason.HOST_DRAM,
                                message=f"memory on node(s) {','.join(full) or '-'}: only {len(roomy)} of "
                                        f"{len(group.rollout)} rollout nodes have room, job needs {k}")
    return out, memory_note


def slo_check(cand: Candidate, job: JobSpec, config: PolicyConfig) -> tuple[dict[str, float] | None, Rejection | None]:
    """Step 3: simulate the intra-group schedule with the job added; reject on any SLO breach."""
    group = cand.group
    assert job.t_roll_s is not None
    t_train = group.stretched_train_s(job)
    # Cheap necessary condition first: every member's period is at least max(T_cycle', T_load').
    node_loads = [group.rollout[n].load_s + job.t_roll_s for n in cand.existing_nodes]
    if cand.new_nodes:
        node_loads.append(job.t_roll_s)
    lower = max(group.t_cycle_s, job.t_roll_s + t_train, group.train_load_s + t_train,
                group.max_node_load_s, *node_loads)
    budget = min(group.min_budget_s, job.slo * job.t_solo_s)
    tol = 1.0 + config.slo_tolerance
    if lower > budget * tol:
        return None, _slo_rejection(cand, job, {n: lower for n in [*group.members, job.name]})
    new_nodes = tuple(f"<new{i}>" for i in range(cand.new_nodes))
    timings = group.timings() + [MemberTiming(name=job.name, t_roll_s=job.t_roll_s, t_train_s=t_train,
                                              rollout_nodes=cand.existing_nodes + new_nodes)]
    period = cycle_time(timings)  # exact steady state of the round-robin schedule
    periods = {t.name: period for t in timings}
    budgets = {n: m.budget_s for n, m in group.members.items()} | {job.name: job.slo * job.t_solo_s}
    if any(periods[n] > budgets[n] * tol for n in periods):
        return None, _slo_rejection(cand, job, periods)
    return periods, None


def _slo_rejection(cand: Candidate, job: JobSpec, periods: dict[str, float]) -> Rejection:
    specs = {n: m.spec for n, m in cand.group.members.items()} | {job.name: job}
    worst = max(periods, key=lambda n: periods[n] / specs[n].t_solo_s - specs[n].slo)
    spec = specs[worst]
    return Rejection(group_id=cand.group.group_id, strategy=cand.strategy, reason=RejectReason.SLO,
                     message=f"SLO of job {worst}: {periods[worst] / spec.t_solo_s:.2f} > {spec.slo:.2f} "
                             f"(+{cand.new_nodes} rollout nodes)")


class RollMuxPolicy:
    """Cost-minimising placement under SLO and host-memory limits (paper Algorithm 1)."""

    name = "rollmux"

    def __init__(self, config: PolicyConfig | None = None, **_: object) -> None:
        self.config = config or PolicyConfig()

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision:
        if not job.has_times or job.rollout_state_bytes is None or job.train_state_bytes is None:
            raise PolicyError(f"job {job.name} is not resolved: call profiler.resolve() before placing it")
        cluster = state.cluster
        node_price = cluster.node_usd_per_h(Pool.ROLLOUT)
        rejections: list[Rejection] = []
        if self.config.fill_saturated:
            groups = list(state.groups.values())
        else:  # Algorithm 1, line 4; the state keeps this index, so no per-group work here
            groups = state.unsaturated_groups()
            saturated = state.saturated_group_ids()
            if saturated:
                rejections.append(Rejection(group_id=",".join(saturated), strategy=None,
                                            reason=RejectReason.SATURATED,
                                            message=f"{len(saturated)} group(s) have T_load >= T_cycle"))
        best: tuple[float, Candidate, dict[str, float]] | None = None
        for i, group in enumerate(groups):
            if best is not None and best[0] == 0.0:
                rejections += [Rejection(group_id=g.group_id, strategy=None, reason=RejectReason.NOT_EVALUATED,
                                         message=f"{best[1].group.group_id} already packs the job at +$0/h")
                               for g in groups[i:]]
                break
            pruned = group_prune_reason(group, job, self.config)
            if pruned is not None:
                rejections.append(pruned)
                continue
            cands, memory_note = candidates(group, job, cluster)
            if memory_note is not None:
                rejections.append(memory_note)
            for cand in cands:
                delta = cand.new_nodes * node_price
                if best is not None and delta >= best[0]:
                    break  # cheaper-first order: nothing further in this group can win
                periods, rejected = slo_check(cand, job, self.config)
                if rejected is not None:
                    rejections.append(rejected)
                    continue
                assert periods is not None
                best = (delta, cand, periods)
                break
        iso = isolated_cost(job, cluster)
        if best is None or iso < best[0]:
            return PlacementDecision(
                job=job.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                new_rollout_nodes=cluster.nodes_for(job.n_rollout_gpus),
                new_train_nodes=cluster.nodes_for(job.n_train_gpus), delta_usd_per_h=iso,
                t_coexec_s={job.name: job.t_roll_s + job.t_train_s},  # type: ignore[operator]
                rejections=tuple(rejections))
        delta, cand, periods = best
        return PlacementDecision(
            job=job.name, strategy=cand.strategy, group_id=cand.group.group_id,
            rollout_nodes=cand.existing_nodes, new_rollout_nodes=cand.new_nodes, new_train_nodes=0,
            delta_usd_per_h=delta, t_coexec_s=periods, rejections=tuple(rejections))


register_policy(RollMuxPolicy.name, RollMuxPolicy)
