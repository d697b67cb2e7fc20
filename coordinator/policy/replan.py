"""Multi-move regrouping: re-partition the jobs of the groups an event touched, all moves at once.

A single move, pair merge or pool merge (`regroup.plan_moves`) must pay on its own. The cheapest
arrangement often needs several moves that pay only together: one job leaves a group so that two
lone jobs can share it, while it pairs with a third. `plan_regroup` looks at a bounded set of jobs
(the members of the groups an arrival, departure or learning event touched, then of the fleet's
smallest groups, whole groups only, at most `max_jobs`), finds their cheapest partition
(`optimum.optimal_partition` with the live co-execution margins), builds it on a scratch copy of
the cluster with the policy's own checks (every join passes `placement.slo_check`, margins
included, and the host-DRAM checks; `ClusterState.apply` checks the invariants), and proposes it as
one `Plan` when it pays: the $ it saves over the shortest remaining run of the jobs it moves is at
least `regroup_payback` times what their downtime costs, and each moved job's downtime fits its SLO
slack, as for a single move. Members that keep their group do not move.

The plan is pure data, in apply order; `switch.PlanSwitch` carries it out in one epoch (every moved
job acknowledges, or nothing changes) and `apply_plan` applies it to a `ClusterState`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from rollmux.coordinator.policy.api import PlacementDecision, PolicyError, Strategy
from rollmux.coordinator.policy.intra_group import member_periods
from rollmux.coordinator.policy.optimum import (
    MAX_OPT_JOBS,
    OptimalGroup,
    SearchBudgetError,
    optimal_partition,
)
from rollmux.coordinator.policy.placement import (
    Candidate,
    RollMuxPolicy,
    allowed_modes,
    candidates,
    isolated_cost,
    join_decision,
    new_group_options,
    slo_check,
)
from rollmux.coordinator.policy.regroup import (
    SLACK_SHARE,
    Move,
    RemainingFn,
    relocation_s,
    work_rate,
    work_saving,
)
from rollmux.coordinator.policy.state import ClusterState, GroupState, PhaseProfile
from rollmux.core.model import Deployment, JobSpec, Pool

PLAN_JOBS = 8
"""Jobs one multi-move search re-partitions at most (the exact partition is exponential in them)."""

SEARCH_STEPS = 20_000
"""Pinning steps one multi-move search may take (`optimum.optimal_partition`'s `max_steps`): a few
hundred ms of one core; some job sets need minutes to prove their groups infeasible, and an event
loop must not wait that long. Past it, no plan."""

_NEW = "<plan-"  # group ids and node ids a plan opens are named `<plan-...>` until applied


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Moves that pay only together; applied all at once or not at all."""

    moves: tuple[Move, ...]  # apply order: every moved job leaves first, then each joins by its decision
    usd_before: float  # $/h of the groups the plan looked at, before
    usd_after: float  # their $/h after the plan
    saving_usd_per_h: float  # work-aware saving (`regroup.work_saving`)
    reason: str
    # Per move: the placeholder id of the group it opens ("" for a join) and of the nodes it adds, in
    # allocation order; later moves name them, `apply_plan` maps them to the ids the state gives.
    steps: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(m.job for m in self.moves)


def _profile(state: ClusterState, name: str) -> PhaseProfile:
    return state.groups[state.job_group[name]].members[name].profile


def _planned_spec(spec: JobSpec, profile: PhaseProfile) -> JobSpec:
    """The spec the partition search plans with: its learned times where known."""
    if not profile.learned:
        return spec
    return replace(spec, t_roll_s=profile.t_roll_s, t_train_s=profile.t_train_s)


def _fork(state: ClusterState) -> ClusterState:
    """A scratch copy whose group table and indexes are its own; groups are cloned before a change (`_own`)."""
    fork = copy.copy(state)
    fork.groups = dict(state.groups)
    fork._unsaturated = dict(state._unsaturated)  # noqa: SLF001
    fork.job_group = dict(state.job_group)
    fork.node_group = dict(state.node_group)
    fork._group_seq = copy.copy(state._group_seq)  # noqa: SLF001
    return fork


def _own(fork: ClusterState, gid: str, owned: set[str]) -> GroupState:
    if gid not in owned:
        fork.groups[gid] = fork.groups[gid].clone()
        if gid in fork._unsaturated:  # noqa: SLF001
            fork._unsaturated[gid] = fork.groups[gid]  # noqa: SLF001
        owned.add(gid)
    return fork.groups[gid]


def search_jobs(state: ClusterState, touched: Sequence[str], max_jobs: int = PLAN_JOBS) -> list[str]:
    """Group ids the search looks at: the touched groups, then the fleet's smallest groups (lone ones
    first, the latest first among equals), whole groups only, at most `max_jobs` jobs in all."""
    chosen: list[str] = []
    count = 0
    order = list(dict.fromkeys(g for g in touched if g in state.groups))
    rest = sorted((g for g in reversed(state.groups) if g not in order), key=lambda g: len(state.groups[g].members))
    for gid in order + rest:
        size = len(state.groups[gid].members)
        if count + size > max_jobs:
            if gid in order:
                continue
            break
        chosen.append(gid)
        count += size
    return chosen


def plan_regroup(state: ClusterState, policy: RollMuxPolicy, touched: Sequence[str], remaining: RemainingFn,
                 max_jobs: int = PLAN_JOBS, fresh: Collection[str] = ()) -> Plan | None:
    """The cheapest re-partition of the jobs in `touched` groups (and the smallest others, up to
    `max_jobs`), as one plan of several moves, if it pays; None otherwise. `fresh`: jobs placed but
    not started (an arrival's plan), whose move costs no downtime (nothing to checkpoint)."""
    config = policy.config
    if not config.regroup:
        return None
    gids = search_jobs(state, touched, min(max_jobs, MAX_OPT_JOBS))
    names = [n for g in gids for n in state.groups[g].members]
    if len(gids) < 2:
        return None
    specs = {n: state.groups[state.job_group[n]].members[n].spec for n in names}
    planned = [_planned_spec(specs[n], _profile(state, n)) for n in names]
    try:
        part = optimal_partition(planned, state.cluster, config, margins=True, max_steps=SEARCH_STEPS)
    except SearchBudgetError:
        return None  # a search past its bound proposes nothing: every job stays where it is
    usd_before = sum(state.groups[g].usd_per_h for g in gids)
    if part.usd_per_h >= usd_before - 1e-6:
        return None
    current = {g: frozenset(state.groups[g].members) for g in gids}
    targets = [frozenset(g.jobs) for g in part.groups]
    if sorted(map(sorted, targets)) == sorted(map(sorted, current.values())):
        return None
    for keep_bases in (True, False):
        built = _realise(state, policy, gids, targets, current, keep_bases, None if keep_bases else part.groups, fresh)
        if built is not None:
            break
    else:
        return None
    fork, moves, new_gids, steps = built
    after_gids = [g for g in gids if g in fork.groups] + new_gids
    usd_after = sum(fork.groups[g].usd_per_h for g in after_gids)
    rate_before = sum(work_rate(state.groups[g]) for g in gids)
    rate_after = sum(work_rate(fork.groups[g]) for g in after_gids)
    saving = work_saving(usd_before, rate_before, usd_after, rate_after)
    if saving <= 1e-9 or not moves:
        return None
    if not _pays(state, policy, fork, moves, saving, remaining):
        return None
    why = (f"{len(moves)} moves re-partition {len(names)} jobs of {len(gids)} groups "
           f"(${usd_before:,.2f}/h -> ${usd_after:,.2f}/h): they pay only together")
    final = tuple(replace(m, saving_usd_per_h=saving, reason=f"{why}; {m.reason}") for m in moves)
    return Plan(moves=final, usd_before=usd_before, usd_after=usd_after, saving_usd_per_h=saving, reason=why,
                steps=tuple(steps))


def _pays(state: ClusterState, policy: RollMuxPolicy, fork: ClusterState, moves: Sequence[Move], saving: float,
          remaining: RemainingFn) -> bool:
    """Saving over the shortest remaining run of the moved jobs >= payback x their downtime's $, and
    each moved job's downtime fits `regroup.SLACK_SHARE` of its SLO slack where it goes.

    The moves switch together, so the downtime costs each group a moved job lands in its whole $/h
    until its slowest arrival has reloaded (its members wait for it in the round-robin order), and
    each moved job at least its own lone group's $ for its own downtime."""
    config = policy.config
    rem = {m.job: remaining(m.job) for m in moves}
    if min(rem.values()) <= 0:
        return False
    wait: dict[str, float] = {}
    own_usd_s = 0.0
    for m in moves:
        gid = fork.job_group[m.job]
        target = fork.groups[gid]
        member = target.members[m.job]
        spec = member.spec
        wait[gid] = max(wait.get(gid, 0.0), m.downtime_s)
        own_usd_s += isolated_cost(spec, state.cluster) * m.downtime_s
        t_solo = member.profile.t_solo_s if member.profile.learned else spec.t_solo_s
        slowdown = member_periods(target.timings())[m.job] / t_solo  # once the whole plan is in place
        if m.downtime_s > SLACK_SHARE * (spec.slo - slowdown) * rem[m.job]:
            return False
    downtime_usd_s = max(own_usd_s, sum(fork.groups[g].usd_per_h * s for g, s in wait.items()))
    return saving * min(rem.values()) >= config.regroup_payback * downtime_usd_s


def _realise(state: ClusterState, policy: RollMuxPolicy, gids: Sequence[str], targets: Sequence[frozenset[str]],
             current: dict[str, frozenset[str]], keep_bases: bool, exact: Sequence[OptimalGroup] | None = None,
             fresh: Collection[str] = ()) -> tuple[ClusterState, list[Move], list[str], list[tuple[str, tuple[str, ...]]]] | None:
    """Build `targets` on a scratch fork: each target keeps the existing group it overlaps most (with
    `keep_bases`; its overlapping members stay), the other jobs leave and join by the policy's checks.
    Without bases and with `exact` (the optimum's groups), each group is built in the optimum's member
    order and rollout pinning. Returns (fork, moves in apply order, ids of the groups opened, the
    moves' placeholder ids) or None when a join fails a check."""
    bases: dict[int, str] = {}
    if not keep_bases:  # a target that is an existing group as it is stays
        bases = {k: g for k, t in enumerate(targets) for g in gids if current[g] == t}
    else:
        free = set(gids)
        for k in sorted(range(len(targets)), key=lambda k: -len(targets[k])):
            best = max(free, key=lambda g: (len(targets[k] & current[g]), -list(gids).index(g)), default=None)
            if best is not None and targets[k] & current[best]:
                bases[k] = best
                free.discard(best)
    stay = {n for k, g in bases.items() for n in targets[k] & current[g]}
    fork, owned = _fork(state), set[str]()
    where = {n: state.job_group[n] for g in gids for n in current[g]}
    specs = {n: state.groups[where[n]].members[n].spec for n in where}
    profiles = {n: state.groups[where[n]].members[n].profile for n in where}
    movers = [n for n in where if n not in stay]
    for n in movers:
        _own(fork, where[n], owned)
        fork.remove_job(n)
    moves: list[Move] = []
    steps: list[tuple[str, tuple[str, ...]]] = []
    opened: list[str] = []
    seq = iter(range(1 << 30))
    made: list[str] = []

    def alloc(pool: Pool, count: int) -> list[str]:
        ids = [f"{_NEW}{pool.value}-{next(seq)}>" for _ in range(count)]
        made.extend(ids)
        return ids

    for k, target in enumerate(targets):
        gid = bases.get(k)
        if gid is not None and gid not in fork.groups:
            return None  # every member left: nothing kept
        if gid is None and exact is not None:  # the optimum's own order and pinning
            joiners = [n for n in exact[k].jobs if n not in stay]
        else:
            joiners = sorted((n for n in target if n not in stay),
                             key=lambda n: (-isolated_cost(specs[n], state.cluster), -specs[n].t_solo_s, n))
        rollout: list[str] = []  # the new group's rollout nodes in the optimum's index order
        for n in joiners:
            spec, prof = specs[n], profiles[n]
            if gid is None:
                decision = _opening(policy, spec, state, exact[k] if exact is not None else None, len(target) > 1)
            else:
                group = _own(fork, gid, owned)
                pinned, new = None, 0
                if exact is not None and k not in bases:
                    pinned = [rollout[i] for i in exact[k].pinning[n] if i < len(rollout)]
                    new = len([i for i in exact[k].pinning[n] if i >= len(rollout)])
                decision = _join(policy, spec, prof, group, pinned, new)
            if decision is None:
                return None
            made.clear()
            try:
                group = fork.apply(spec, decision, allocate=alloc)
            except PolicyError:
                return None
            rollout = list(group.rollout)
            opens = ""
            if gid is None:
                gid = opens = group.group_id
                opened.append(gid)
                owned.add(gid)
            steps.append((opens, tuple(made)))
            if prof != PhaseProfile.planned(spec):
                group.set_profile(n, prof)
            moves.append(Move(job=n, from_group=where[n], decision=decision, saving_usd_per_h=0.0,
                              downtime_s=0.0 if n in fresh else relocation_s(spec, policy.config),
                              reason=f"{n}: {where[n]} -> {gid} ({decision.strategy.value}, {decision.deployment.value})"))
    return fork, moves, opened, steps


def _opening(policy: RollMuxPolicy, spec: JobSpec, state: ClusterState, exact: OptimalGroup | None,
             multi: bool) -> PlacementDecision | None:
    """The first job of a target group, in a new group: alone, its cheapest lone group that meets its
    SLO; with others to join, a disaggregated group of the optimum's training nodes (the most any of
    them needs) and the job's own rollout nodes."""
    if not multi:
        options = policy.alone_options(spec, state.cluster)
        return options[0] if options else None
    if Deployment.DISAGGREGATED not in allowed_modes(spec, policy.config):
        return None
    o = new_group_options(spec, state.cluster, (Deployment.DISAGGREGATED,))[0]
    train = max(o.train_nodes, exact.train_nodes if exact is not None else 0)
    roll = len(exact.pinning[spec.name]) if exact is not None else o.rollout_nodes
    usd = roll * state.cluster.node_usd_per_h(Pool.ROLLOUT) + train * state.cluster.node_usd_per_h(Pool.TRAIN)
    return PlacementDecision(job=spec.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                             new_rollout_nodes=roll, new_train_nodes=train, delta_usd_per_h=usd,
                             t_coexec_s={spec.name: o.planned_s}, deployment=o.deployment, train_pool=o.train_pool,
                             reason="multi-move: opens a group")


def _join(policy: RollMuxPolicy, spec: JobSpec, profile: PhaseProfile, group: GroupState,
          pinned: list[str] | None = None, new_nodes: int = 0) -> PlacementDecision | None:
    """`spec` into `group` on `pinned` existing plus `new_nodes` new rollout nodes (the optimum's
    pinning), else by its cheapest candidate, if it passes the policy's checks (group size, nodes
    that take work, SLO with margins, host DRAM)."""
    config = policy.config
    prof = profile if profile.learned else policy.initial_profile(spec)
    if (len(group.members) >= config.max_group_size or not group.train_available
            or not group.allows(Deployment.DISAGGREGATED) or spec.n_train_gpus > group.train_gpus):
        return None
    cluster = group._cluster  # noqa: SLF001 (the group's own price table)
    if pinned is not None:
        cands = [Candidate(group=group, existing_nodes=tuple(pinned), new_nodes=new_nodes)]
        if any(not group.rollout[n].available
               or group.rollout[n].dram_used_bytes + (spec.rollout_state_bytes or 0) >= group.rollout[n].host_dram_bytes
               for n in pinned):
            cands = []
    else:
        cands, _ = candidates(group, spec, cluster, allowed_modes(spec, config))
    for cand in cands:
        periods, rejected = slo_check(cand, spec, config, prof)
        if rejected is None and periods is not None:
            delta = cand.delta_usd_per_h(cluster)
            return join_decision(spec, cand, delta, periods, (), reason=f"multi-move: joins {group.group_id}")
    return None


def apply_plan(state: ClusterState, plan: Plan, allocate: Callable[[Pool, int], list[str]] | None = None) -> list[str]:
    """Carry out `plan` on `state` all at once; returns the node ids released. Raises PolicyError and
    leaves `state` as it was when a move no longer applies (the plan was made on another state): the
    whole plan is first applied to a scratch copy, and to `state` only when all of it applied there."""
    _apply_all(_fork(state), plan, None, set())
    return _apply_all(state, plan, allocate, None)


def _apply_all(state: ClusterState, plan: Plan, allocate: Callable[[Pool, int], list[str]] | None,
               owned: set[str] | None) -> list[str]:
    """Every moved job leaves, then each joins by its decision, the plan's placeholder group and node
    ids mapped to those the state gives them. `owned`: `state` is a scratch fork (clone groups first)."""
    members = {}
    for m in plan.moves:
        gid = state.job_group.get(m.job)
        if gid != m.from_group:
            raise PolicyError(f"plan moves {m.job} out of {m.from_group}, but it is in {gid or 'no group'}")
        members[m.job] = state.groups[gid].members[m.job]
    released: list[str] = []
    for m in plan.moves:
        if owned is not None:
            _own(state, m.from_group, owned)
        released += state.remove_job(m.job)
    names: dict[str, str] = {}  # a plan's placeholder id -> the real id

    def alloc(pool: Pool, count: int) -> list[str]:
        return allocate(pool, count) if allocate is not None else state._fresh_nodes(pool, count)  # noqa: SLF001

    for m, (opens, placeholders) in zip(plan.moves, plan.steps):
        d = m.decision
        gid = names.get(d.group_id, d.group_id) if d.group_id is not None else None
        if gid is not None and gid not in state.groups:
            raise PolicyError(f"plan joins {m.job} to {gid}, which no longer exists")
        if gid is not None and owned is not None:
            _own(state, gid, owned)
        d = replace(d, group_id=gid, rollout_nodes=tuple(names.get(n, n) for n in d.rollout_nodes))
        new_ids: list[str] = []

        def recording(pool: Pool, count: int, _ids: list[str] = new_ids) -> list[str]:
            ids = alloc(pool, count)
            _ids.extend(ids)
            return ids

        group = state.apply(members[m.job].spec, d, allocate=recording)
        if opens:
            names[opens] = group.group_id
            if owned is not None:
                owned.add(group.group_id)
        names.update(zip(placeholders, new_ids))
        if members[m.job].profile != PhaseProfile.planned(members[m.job].spec):
            group.set_profile(m.job, members[m.job].profile)
    return released
