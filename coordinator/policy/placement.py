"""Inter-group placement: the paper's Algorithm 1, with cached summaries and early exit.

For an arriving job, in group creation order:
  1. skip groups that are saturated, full, or whose training pool is too small;
  2. for each remaining group, try direct packing (its rollout on existing nodes, +$0/h), then
     rollout scaling with 1..k new rollout nodes (+ their price), cheapest first;
  3. reject a placement whose resident state would not fit a node's host DRAM, or whose
     simulated round-robin schedule breaks any member's SLO (a cheap lower bound on the period
     runs before the simulation and rejects most candidates without simulating);
  4. compare the best with a new group: isolated and disaggregated (Solo-D shape), or co-located
     on training-pool GPUs, or on rollout-pool GPUs where the training state fits, each only if
     its planned iteration meets the SLO; the lowest marginal $/h wins, ties to the existing
     (earlier) group, then to the disaggregated new group.

Deployment modes (`rollmux.core.model.Deployment`, `PolicyConfig.modes`): besides joining as a
disaggregated member (rollout on the group's rollout nodes), a job may join a group co-located on
its training pool, where its Rollout time-shares the pool with the members' Trains at +$0/h.
A job that fixes `JobSpec.deployment` is only placed in that mode.

A feasible direct packing costs nothing and ties go to the earliest group, so the first group
that admits one wins outright: later groups are recorded as not evaluated. This keeps the
decision fast at thousands of jobs without changing its outcome.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

from rollmux.coordinator.policy import modes
from rollmux.coordinator.policy.api import (
    PlacementDecision,
    PolicyConfig,
    PolicyError,
    Rejection,
    RejectReason,
    Strategy,
)
from rollmux.coordinator.policy.intra_group import member_periods
from rollmux.coordinator.policy.state import ClusterState, GroupState, Member, PhaseProfile
from rollmux.core.model import ClusterSpec, Deployment, JobSpec, Pool


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A concrete placement of the job into one group, before its checks."""

    group: GroupState
    existing_nodes: tuple[str, ...]  # existing rollout nodes to pin to
    new_nodes: int  # rollout nodes to add
    deployment: Deployment = Deployment.DISAGGREGATED
    new_train_nodes: int = 0  # training nodes the job brings (train scaling); it trains on them only

    @property
    def strategy(self) -> Strategy:
        if self.new_train_nodes:
            return Strategy.TRAIN_SCALING
        return Strategy.DIRECT_PACKING if self.new_nodes == 0 else Strategy.ROLLOUT_SCALING

    def delta_usd_per_h(self, cluster: ClusterSpec) -> float:
        """$/h the candidate adds: its new rollout and training nodes."""
        return (self.new_nodes * cluster.node_usd_per_h(Pool.ROLLOUT)
                + self.new_train_nodes * cluster.node_usd_per_h(self.group.train_pool))

    def member(self, job: JobSpec, profile: PhaseProfile | None = None) -> Member:
        new_ids = tuple(f"<new{i}>" for i in range(self.new_nodes))
        trains = tuple(f"<new-train{i}>" for i in range(self.new_train_nodes)) or None
        return self.group.make_member(job, self.existing_nodes + new_ids, self.deployment, profile, trains)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewGroup:
    """A new group holding only the job, in one deployment mode."""

    deployment: Deployment
    train_pool: Pool  # pool of its "training" nodes (all of them when co-located)
    rollout_nodes: int
    train_nodes: int
    usd_per_h: float
    planned_s: float  # the job's planned iteration there


def isolated_cost(job: JobSpec, cluster: ClusterSpec) -> float:
    """$/h of a new group holding only `job` on its own N_R + N_T GPUs (whole nodes)."""
    return (cluster.nodes_for(job.n_rollout_gpus) * cluster.node_usd_per_h(Pool.ROLLOUT)
            + cluster.nodes_for(job.n_train_gpus) * cluster.node_usd_per_h(Pool.TRAIN))


def allowed_modes(job: JobSpec, config: PolicyConfig) -> tuple[Deployment, ...]:
    """The job's fixed mode, or every mode (disaggregated only with `modes=False`)."""
    if job.deployment is not None:
        return (job.deployment,)
    return tuple(Deployment) if config.modes else (Deployment.DISAGGREGATED,)


def new_group_options(job: JobSpec, cluster: ClusterSpec, allowed: tuple[Deployment, ...]) -> list[NewGroup]:
    """Every new group the job could start, feasible or not, disaggregated first."""
    out = []
    if Deployment.DISAGGREGATED in allowed:
        out.append(NewGroup(deployment=Deployment.DISAGGREGATED, train_pool=Pool.TRAIN,
                            rollout_nodes=cluster.nodes_for(job.n_rollout_gpus),
                            train_nodes=cluster.nodes_for(job.n_train_gpus), usd_per_h=isolated_cost(job, cluster),
                            planned_s=job.t_solo_s))
    for mode in (Deployment.COLOCATED_TRAIN, Deployment.COLOCATED_ROLLOUT):
        if mode not in allowed:
            continue
        pool = modes.pool_of(mode)
        for n in sorted({cluster.nodes_for(job.n_train_gpus), cluster.nodes_for(max(job.n_rollout_gpus, job.n_train_gpus))}):
            gpus = n * cluster.gpus_per_node
            if modes.training_fits(job, cluster, pool, gpus):
                out.append(NewGroup(deployment=mode, train_pool=pool, rollout_nodes=0, train_nodes=n,
                                    usd_per_h=n * cluster.node_usd_per_h(pool),
                                    planned_s=modes.colocated_solo_s(job, cluster, pool, gpus)))
    return out


def group_prune_reason(group: GroupState, job: JobSpec, config: PolicyConfig,
                       allowed: tuple[Deployment, ...] = (Deployment.DISAGGREGATED,),
                       profile: PhaseProfile | None = None, cache: _LoadCache | None = None) -> Rejection | None:
    """Step 1: reasons to skip a group before looking at any placement in it."""
    gid = group.group_id
    if not group.train_available:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.NODE_UNAVAILABLE,
                         message=f"training node(s) {','.join(sorted(group.train_unavailable))} cannot take work "
                                 "(draining, drained or lost)")
    if len(group.members) >= config.max_group_size:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.GROUP_FULL,
                         message=f"{len(group.members)} jobs = max group size {config.max_group_size}")
    if (config.regroup and config.pool_merge and not (config.pooled_joins and config.work_aware) and group.members
            and len(group.train_nodes) > group.max_member_train_nodes):
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.TRAIN_POOL,
                         message=f"training pool of {len(group.train_nodes)} nodes is larger than any member needs "
                                 f"({group.max_member_train_nodes}): a pool merge's or a departed job's, not grown by joins")
    if not any(group.allows(m) for m in allowed):
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.TRAIN_POOL,
                         message=f"group runs on the {group.train_pool.value} pool; job allows "
                                 f"{', '.join(m.value for m in allowed)}")
    scales = train_scales(group, job, config, allowed)
    if job.n_train_gpus > group.train_gpus and not scales:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.TRAIN_POOL,
                         message=f"job needs {job.n_train_gpus} training GPUs, group has {group.train_gpus}")
    assert job.train_state_bytes is not None
    if group.least_train_dram_used_bytes + job.train_state_bytes >= group.train_dram_bytes and not scales:
        return Rejection(group_id=gid, strategy=None, reason=RejectReason.HOST_DRAM,
                         message=f"memory on training nodes {','.join(group.train_nodes)}: "
                                 f"{(group.least_train_dram_used_bytes + job.train_state_bytes) / 1e9:.1f} GB "
                                 f">= {group.train_dram_bytes / 1e9:.1f} GB")
    if job.n_train_gpus > group.train_gpus:
        return None  # only train scaling can take it: its own nodes, no bound from the pool's shape
    return slo_bound_rejection(group, job, config, allowed, profile, cache)


def train_scales(group: GroupState, job: JobSpec, config: PolicyConfig,
                 allowed: tuple[Deployment, ...] = (Deployment.DISAGGREGATED,)) -> bool:
    """Train scaling may place `job` in `group`: on, a job that is not elastic, disaggregated, a
    group on the training pool."""
    return (config.train_scaling and not job.elastic and Deployment.DISAGGREGATED in allowed
            and group.allows(Deployment.DISAGGREGATED))


def _mode_lower_bound(group: GroupState, member: Member) -> float:
    """No placement of `member` in `group` has a period below this (shared loads)."""
    return _bound(group, (member.t_roll_s + member.t_train_in_group_s, member.train_pool_load_s),
                  group.train_load_on_s(member.train_nodes))


def _bound(group: GroupState, loads: tuple[float, float], train_base_s: float | None = None) -> float:
    """The lower bound from a member's (own cycle, training-node load) in `group`, the member's
    training nodes already carrying `train_base_s` (default: the least any training node carries).

    The group's T_cycle and busiest rollout node bound the period of the members they belong to,
    which may share no node with the newcomer: kept in the bound all the same (conservative), since
    a member that spans every training node, as the largest usually does, couples all of them."""
    cycle, pool = loads
    base = min(group.train_node_load_s.values(), default=0.0) if train_base_s is None else train_base_s
    return max(group.t_cycle_s, cycle, base + pool, group.max_node_load_s)


_LoadCache = dict[tuple[object, int, Deployment], tuple[float, float]]


def _member_loads(group: GroupState, job: JobSpec, mode: Deployment, profile: PhaseProfile | None,
                  cache: _LoadCache | None) -> tuple[float, float]:
    """(own cycle, training-pool load) of `job` in `mode` in `group`; the same for every group with
    the same training pool and size, so `cache` (one placement's) keeps them."""
    key = (group.train_pool, group.train_gpus, mode)
    if cache is not None and key in cache:
        return cache[key]
    m = group.make_member(job, (), mode, profile)
    loads = (m.t_roll_s + m.t_train_in_group_s, m.train_pool_load_s)
    if cache is not None:
        cache[key] = loads
    return loads


def slo_bound_rejection(group: GroupState, job: JobSpec, config: PolicyConfig,
                        allowed: tuple[Deployment, ...] = (Deployment.DISAGGREGATED,),
                        profile: PhaseProfile | None = None, cache: _LoadCache | None = None) -> Rejection | None:
    """Whole-group SLO pruning: no placement can beat max(T_cycle', training-pool load', node loads).

    Every member of a group shares one period, which is at least each of those loads; if that
    bound already exceeds the tightest SLO budget in every allowed mode, nothing needs simulating.
    """
    # its own new training nodes carry nothing yet; else the least loaded training node, found once for every mode
    base = 0.0 if train_scales(group, job, config, allowed) else min(group.train_node_load_s.values(), default=0.0)
    lower = min(_bound(group, _member_loads(group, job, m, profile, cache), base) for m in allowed if group.allows(m))
    job_budget = job.slo * (profile.t_solo_s if profile else job.t_solo_s)
    budget, who = (group.min_budget_s, group.min_budget_job) if group.min_budget_s < job_budget else (job_budget, job.name)
    if lower <= budget * (1.0 + config.slo_tolerance):
        return None
    member = group.members.get(who)
    t_solo, slo = (member.profile.t_solo_s, member.spec.slo) if member else (job.t_solo_s, job.slo)
    return Rejection(group_id=group.group_id, strategy=None, reason=RejectReason.SLO,
                     message=f"SLO of job {who}: at least {lower / t_solo:.2f} > {slo:.2f} whatever the placement")


def candidates(group: GroupState, job: JobSpec, cluster: ClusterSpec,
               allowed: tuple[Deployment, ...] = (Deployment.DISAGGREGATED,),
               train_scaling: bool = False) -> tuple[list[Candidate], Rejection | None]:
    """Step 2: direct packing, co-location on the group's pool, then rollout scaling and (with
    `train_scaling`, a job that is not elastic) train scaling, cheapest first.

    Existing nodes are taken least loaded first (by the T_roll already pinned there), among those
    whose host DRAM still has room for the job's rollout state.
    """
    assert job.rollout_state_bytes is not None and job.train_state_bytes is not None
    out: list[Candidate] = []
    memory_note = None
    colocated = modes.colocated_mode(group.train_pool)
    if Deployment.DISAGGREGATED in allowed and group.allows(Deployment.DISAGGREGATED):
        k = cluster.nodes_for(job.n_rollout_gpus)
        roomy = sorted((n for n in group.rollout.values()
                        if n.available and n.dram_used_bytes + job.rollout_state_bytes < n.host_dram_bytes),
                       key=lambda n: (n.load_s, n.node_id))
        out = [Candidate(group=group, existing_nodes=tuple(n.node_id for n in roomy[: k - s]), new_nodes=s)
               for s in range(0, k + 1) if len(roomy) >= k - s]
        if job.n_train_gpus > group.train_gpus:  # its own GPUs do not fit the pool: only its own new nodes
            out = []
        if train_scaling and not job.elastic and len(roomy) >= k and group.train_pool is Pool.TRAIN:
            out.append(Candidate(group=group, existing_nodes=tuple(n.node_id for n in roomy[:k]), new_nodes=0,
                                 new_train_nodes=cluster.nodes_for(job.n_train_gpus)))
            out.sort(key=lambda c: c.delta_usd_per_h(cluster))  # stable: packing before the rest at a tie
        if len(roomy) < k:
            full = [n.node_id for n in group.rollout.values() if n not in roomy]
            memory_note = Rejection(group_id=group.group_id, strategy=Strategy.DIRECT_PACKING,
                                    reason=RejectReason.HOST_DRAM,
                                    message=f"memory on node(s) {','.join(full) or '-'}: only {len(roomy)} of "
                                            f"{len(group.rollout)} rollout nodes have room, job needs {k}")
    if (colocated in allowed and modes.training_fits(job, cluster, group.train_pool, group.train_gpus)
            and group.train_dram_used_bytes + job.train_state_bytes + job.rollout_state_bytes < group.train_dram_bytes):
        at = 1 if out and out[0].strategy is Strategy.DIRECT_PACKING else 0  # after it: same +$0/h, less pool load
        out.insert(at, Candidate(group=group, existing_nodes=(), new_nodes=0, deployment=colocated))
    return out, memory_note


def slo_check(cand: Candidate, job: JobSpec, config: PolicyConfig,
              profile: PhaseProfile | None = None) -> tuple[dict[str, float] | None, Rejection | None]:
    """Step 3: simulate the intra-group schedule with the job added; reject on any SLO breach."""
    group = cand.group
    member = cand.member(job, profile)
    state_bytes = (job.train_state_bytes or 0) + ((job.rollout_state_bytes or 0) if member.colocated else 0)
    if group.train_dram_on(member.train_nodes) + state_bytes >= group.train_dram_bytes:
        return None, Rejection(group_id=group.group_id, strategy=cand.strategy, reason=RejectReason.HOST_DRAM,
                               message=f"memory on training node(s) {','.join(member.train_nodes)}: "
                                       f"{(group.train_dram_on(member.train_nodes) + state_bytes) / 1e9:.1f} GB "
                                       f">= {group.train_dram_bytes / 1e9:.1f} GB")
    # Cheap necessary condition first: every member's period is at least max(T_cycle', T_load').
    node_loads = [group.rollout[n].load_s + member.t_roll_s for n in cand.existing_nodes]
    lower = max([_mode_lower_bound(group, member), *node_loads])
    budget = min(group.min_budget_s, member.budget_s)
    tol = 1.0 + config.slo_tolerance
    if lower > budget * tol:
        return None, _slo_rejection(cand, job, {n: lower for n in [*group.members, job.name]})
    timings = group.timings() + [member.timing()]
    periods = member_periods(timings)  # exact steady state of the round-robin schedule
    # Co-execution: per-iteration times vary, so the realised period runs above the fixed-time one:
    # every member keeps a margin below its budget (`coexec_margin`), a wider one in a group of
    # BIG_GROUP or more members (`coexec_margin_big`), where more phases contend for each node.
    budgets = {n: m.budget_s for n, m in group.members.items()} | {job.name: member.budget_s}
    if group.members:
        tol /= 1.0 + (config.coexec_margin_big if len(group.members) + 1 >= BIG_GROUP else config.coexec_margin)
    if any(periods[n] > budgets[n] * tol for n in periods):
        return None, _slo_rejection(cand, job, periods)
    return periods, None


BIG_GROUP = 4
"""Members from which a join keeps `PolicyConfig.coexec_margin_big` below every budget."""


def _slo_rejection(cand: Candidate, job: JobSpec, periods: dict[str, float]) -> Rejection:
    solo = {n: (m.profile.t_solo_s, m.spec.slo) for n, m in cand.group.members.items()} | {job.name: (job.t_solo_s, job.slo)}
    worst = max(periods, key=lambda n: periods[n] / solo[n][0] - solo[n][1])
    t_solo, slo = solo[worst]
    how = "" if cand.deployment is Deployment.DISAGGREGATED else f", {cand.deployment.value}"
    return Rejection(group_id=cand.group.group_id, strategy=cand.strategy, reason=RejectReason.SLO,
                     message=f"SLO of job {worst}: {periods[worst] / t_solo:.2f} > {slo:.2f} "
                             f"(+{cand.new_nodes} rollout nodes{how})")


def join_costs_more_per_work(group: GroupState, name: str, t_ref_s: float, delta_usd_per_h: float,
                             periods: dict[str, float], lone_usd_per_h: float, lone_period_s: float) -> Rejection | None:
    """Work-aware check of a join (`PolicyConfig.work_aware`): a rejection when the group with the job
    costs more $ per unit of work than the group as it is plus the job alone in its new group.

    A join at +$0/h is not free when it stretches the group's period: every member then holds the
    group's nodes longer for the same iterations. Work is counted in solo-seconds per second
    (sum of T_solo / period); `t_ref_s` is the job's T_solo in the units its `periods` entry uses.
    """
    before = member_periods(group.timings())
    rate = sum(m.profile.t_solo_s / before[n] for n, m in group.members.items() if before[n] > 0)
    rate_join = sum(m.profile.t_solo_s / periods.get(n, before[n]) for n, m in group.members.items()) + t_ref_s / periods[name]
    rate_lone = rate + t_ref_s / lone_period_s
    join = (group.usd_per_h + delta_usd_per_h) / rate_join
    lone = (group.usd_per_h + lone_usd_per_h) / rate_lone
    if join <= lone * (1.0 + 1e-9):
        return None
    return Rejection(group_id=group.group_id, strategy=None, reason=RejectReason.OCCUPANCY,
                     message=f"joining costs ${join:,.2f} per hour of solo work, alone ${lone:,.2f} "
                             f"(the group's period goes {max(before.values(), default=0.0):.0f} -> {max(periods.values()):.0f} s)")


def join_decision(job: JobSpec, cand: Candidate, delta_usd_per_h: float, periods: dict[str, float],
                  rejections: tuple[Rejection, ...], reason: str) -> PlacementDecision:
    """The decision placing `job` by `cand` into its group."""
    return PlacementDecision(
        job=job.name, strategy=cand.strategy, group_id=cand.group.group_id, rollout_nodes=cand.existing_nodes,
        new_rollout_nodes=cand.new_nodes, new_train_nodes=cand.new_train_nodes, delta_usd_per_h=delta_usd_per_h,
        t_coexec_s=periods, rejections=rejections, deployment=cand.deployment, train_pool=cand.group.train_pool,
        reason=reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Step:
    """One candidate of a group, priced and SLO-checked (`RollMuxPolicy._group_steps`)."""

    delta: float
    cand: Candidate
    periods: dict[str, float] | None
    rejected: Rejection | None


class PhaseLearnerLike(Protocol):
    def prior(self, job: JobSpec) -> PhaseProfile: ...

    def shrink(self) -> tuple[float, float]: ...


class RollMuxPolicy:
    """Cost-minimising placement under SLO and host-memory limits (paper Algorithm 1, with deployment modes)."""

    name = "rollmux"

    def __init__(self, config: PolicyConfig | None = None, **_: object) -> None:
        self.config = config or PolicyConfig()
        self.learner: PhaseLearnerLike | None = None  # set by whoever feeds measured times (sim, coordinator)
        self.memo: dict[tuple[object, ...], tuple[GroupState, tuple[Rejection | None, Rejection | None, list[_Step]]]] | None = None

    def variant(self, **changes: object) -> RollMuxPolicy:
        """This policy with some `PolicyConfig` fields changed, sharing its learner: a fallback
        decision on the same state (the live coordinator's fixed fleet retries with `work_aware` off)."""
        other = RollMuxPolicy(replace(self.config, **changes))  # type: ignore[arg-type]
        other.learner = self.learner
        return other

    def initial_profile(self, job: JobSpec) -> PhaseProfile:
        """How a job without measurements is planned: its worst case, judged against the fleet's learned prior."""
        if self.learner is not None and self.config.learn:
            return self.learner.prior(job)
        return PhaseProfile.planned(job)

    def place(self, job: JobSpec, state: ClusterState, exclude: str | None = None,
              measured: bool = False, profile: PhaseProfile | None = None) -> PlacementDecision:
        """Where `job` goes; `exclude` names a group not to consider (relocating a member out of it).

        `measured`: the job's times are its learned ones (a running job being moved), so they are
        used as they are, without the fleet prior a newcomer is judged against. `profile`: plan the
        job with this profile (a running job's learned one: high-percentile phases, SLO judged
        against its measured solo iteration) instead.
        """
        if not job.has_times or job.rollout_state_bytes is None or job.train_state_bytes is None:
            raise PolicyError(f"job {job.name} is not resolved: call profiler.resolve() before placing it")
        allowed = allowed_modes(job, self.config)
        if profile is None:
            profile = PhaseProfile.planned(job) if measured else self.initial_profile(job)
        rejections: list[Rejection] = []
        best = self._best_join(job, state, allowed, exclude, rejections, profile)
        options, feasible, yardstick = self._new_groups(job, state.cluster, allowed, profile, measured)
        # Nothing meets the SLO alone (a fixed co-located mode that is too slow) and no group takes it: run it
        # anyway, in its first new-group option, which is then the decision and not one of its rejections.
        forced = not feasible and best is None and bool(options)
        if forced:
            feasible = options[:1]
        for o in options:
            if o not in feasible:
                rejections.append(Rejection(group_id="new", strategy=Strategy.ISOLATED, reason=RejectReason.SLO,
                                            message=f"{o.deployment.value} alone on {o.train_nodes} {o.train_pool.value} "
                                                    f"node(s): {o.planned_s / yardstick:.2f} > {job.slo:.2f}"))
        fresh = min(feasible, key=lambda o: o.usd_per_h, default=None)
        reason = "; ".join(f"{o.deployment.value} alone ${o.usd_per_h:,.2f}/h" for o in feasible)
        lone_period = None if fresh is None else self._lone_period(fresh, job, profile, yardstick)
        if best is not None and fresh is not None and lone_period is not None and self.config.work_aware:
            t_ref = profile.t_solo_s if profile.learned else job.t_solo_s
            slower = join_costs_more_per_work(best[1].group, job.name, t_ref, best[0], best[2],
                                              fresh.usd_per_h, lone_period)
            if slower is not None:
                rejections.append(slower)
                best = None
        if best is not None and (fresh is None or best[0] <= fresh.usd_per_h):
            delta, cand, periods = best
            return join_decision(job, cand, delta, periods, tuple(rejections),
                                 reason=f"cheapest feasible: {cand.deployment.value} in {cand.group.group_id} at "
                                        f"+${delta:,.2f}/h" + (f" vs {reason}" if reason else ""))
        assert fresh is not None
        slowdown = fresh.planned_s / yardstick
        if forced:
            why = (f"no group takes it and no new group meets its SLO alone: it runs alone anyway, "
                   f"{fresh.deployment.value} (planned slowdown {slowdown:.2f} > SLO {job.slo:.2f})")
        else:
            why = (f"no group takes it for less; cheapest new group within its SLO: {fresh.deployment.value} "
                   f"(planned slowdown {slowdown:.2f} <= SLO {job.slo:.2f}) of {reason}")
        return self._isolated(job, fresh, profile, yardstick, tuple(rejections), reason=why)

    def join_options(self, job: JobSpec, group: GroupState) -> list[PlacementDecision]:
        """A decision for every placement of `job` in `group` that passes steps 1-3 (direct packing,
        co-location, each rollout scaling), cheapest first; [] when the group is pruned."""
        profile = self.initial_profile(job)
        allowed = allowed_modes(job, self.config)
        if group_prune_reason(group, job, self.config, allowed, profile) is not None:
            return []
        cluster = group._cluster  # noqa: SLF001 (the group's own price table)
        cands, _ = candidates(group, job, cluster, allowed, train_scales(group, job, self.config, allowed))
        out = []
        for cand in cands:
            periods, rejected = slo_check(cand, job, self.config, profile)
            if rejected is None and periods is not None:
                delta = cand.delta_usd_per_h(cluster)
                out.append(join_decision(job, cand, delta, periods, (),
                                         reason=f"{cand.deployment.value} in {group.group_id} at +${delta:,.2f}/h"))
        return out

    def alone_options(self, job: JobSpec, cluster: ClusterSpec) -> list[PlacementDecision]:
        """A decision for each new group `job` could start that meets its SLO there, cheapest first."""
        profile = self.initial_profile(job)
        _, feasible, yardstick = self._new_groups(job, cluster, allowed_modes(job, self.config), profile, False)
        return [self._isolated(job, o, profile, yardstick, (), reason=f"{o.deployment.value} alone")
                for o in sorted(feasible, key=lambda o: o.usd_per_h)]

    def _new_groups(self, job: JobSpec, cluster: ClusterSpec, allowed: tuple[Deployment, ...], profile: PhaseProfile,
                    measured: bool) -> tuple[list[NewGroup], list[NewGroup], float]:
        """Step 4: every new group the job could start, those meeting its SLO, and the solo time judged against."""
        # A lone job's slowdown is its own time there over its own solo time: compare them on the
        # same (prior-shrunk or learned) times, as its owner would measure both.
        lone, yardstick = job, job.t_solo_s
        if profile.learned:
            lone, yardstick = replace(job, t_roll_s=profile.t_roll_s, t_train_s=profile.t_train_s), profile.t_solo_s
        elif self.learner is not None and self.config.learn and not measured:
            r, t = self.learner.shrink()
            lone = replace(job, t_roll_s=job.t_roll_s * r, t_train_s=job.t_train_s * t)  # type: ignore[operator]
            yardstick = profile.t_solo_s  # the prior's: lone's solo iteration (less a margin before the prior exists)
        options = new_group_options(lone, cluster, allowed)
        budget = job.slo * yardstick * (1.0 + self.config.slo_tolerance)
        return options, [o for o in options if o.planned_s <= budget], yardstick

    @staticmethod
    def _lone_period(fresh: NewGroup, job: JobSpec, profile: PhaseProfile, yardstick: float) -> float:
        return fresh.planned_s if profile.learned else fresh.planned_s * job.t_solo_s / yardstick

    def _isolated(self, job: JobSpec, fresh: NewGroup, profile: PhaseProfile, yardstick: float,
                  rejections: tuple[Rejection, ...], reason: str) -> PlacementDecision:
        return PlacementDecision(
            job=job.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
            new_rollout_nodes=fresh.rollout_nodes, new_train_nodes=fresh.train_nodes, delta_usd_per_h=fresh.usd_per_h,
            t_coexec_s={job.name: self._lone_period(fresh, job, profile, yardstick)}, rejections=rejections,
            deployment=fresh.deployment, train_pool=fresh.train_pool, reason=reason)

    def _best_join(self, job: JobSpec, state: ClusterState, allowed: tuple[Deployment, ...], exclude: str | None,
                   rejections: list[Rejection], profile: PhaseProfile) -> tuple[float, Candidate, dict[str, float]] | None:
        """Steps 1-3 over the existing groups: the cheapest feasible join, ties to the earlier group."""
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
        cache: _LoadCache = {}
        for i, group in enumerate(groups):
            if best is not None and best[0] == 0.0:
                rejections += [Rejection(group_id=g.group_id, strategy=None, reason=RejectReason.NOT_EVALUATED,
                                         message=f"{best[1].group.group_id} already packs the job at +$0/h")
                               for g in groups[i:]]
                break
            if group.group_id == exclude:
                continue
            pruned, memory_note, steps = self._group_steps(group, job, allowed, profile, cache,
                                                           None if best is None else best[0])
            if pruned is not None:
                rejections.append(pruned)
                continue
            if memory_note is not None:
                rejections.append(memory_note)
            for step in steps:
                if best is not None and step.delta >= best[0]:
                    break  # cheaper-first order: nothing further in this group can win
                if step.rejected is not None:
                    rejections.append(step.rejected)
                    continue
                assert step.periods is not None
                best = (step.delta, step.cand, step.periods)
                break
        return best

    def _group_steps(self, group: GroupState, job: JobSpec, allowed: tuple[Deployment, ...], profile: PhaseProfile,
                     cache: _LoadCache, beat: float | None = None) -> tuple[Rejection | None, Rejection | None, list[_Step]]:
        """Steps 1-3 for `job` in `group`: its pruning, its memory note, and its candidates cheapest
        first up to the first that passes the SLO check. Kept in `self.memo` while one is open;
        without one, candidates at `beat` $/h or more are not checked (they cannot win)."""
        memo = self.memo
        key = (id(group), job.name, profile, allowed)
        if memo is not None and key in memo:
            return memo[key][1]
        pruned = group_prune_reason(group, job, self.config, allowed, profile, cache)
        note, steps = None, []
        if pruned is None:
            cluster = group._cluster  # noqa: SLF001 (the group's own price table)
            cands, note = candidates(group, job, cluster, allowed, train_scales(group, job, self.config, allowed))
            for cand in cands:
                delta = cand.delta_usd_per_h(cluster)
                if memo is None and beat is not None and delta >= beat:
                    break
                periods, rejected = slo_check(cand, job, self.config, profile)
                steps.append(_Step(delta=delta, cand=cand, periods=periods, rejected=rejected))
                if rejected is None:
                    break
        if memo is not None:
            memo[key] = (group, (pruned, note, steps))  # the group held: its id is not reused meanwhile
        return pruned, note, steps

    def forget(self, group: GroupState) -> None:
        """Drop what the open memo holds for `group` (it was just changed in place: a job joined or left)."""
        if self.memo is not None:
            for key in [k for k, (g, _) in self.memo.items() if g is group]:
                del self.memo[key]

    @contextmanager
    def memoized(self) -> Iterator[None]:
        """Within this block, each (group object, job, profile) is evaluated once (`_group_steps`).

        Why: an admission's lookahead (`admission.place_pending`) places the same pending jobs on
        many scratch forks that share their unchanged groups (copy on write: a group object is
        never changed once a fork shows it), so most of its placements re-evaluate the same pairs.
        Only for callers that change no group they pass to `place` inside the block.
        """
        if self.memo is not None:
            yield
            return
        self.memo = {}
        try:
            yield
        finally:
            self.memo = None


