"""Regrouping: relocate running jobs between groups when the $ saved pays for the move.

Online placement commits in arrival order and never looks back; groups thin out as members
leave. `plan_moves` looks at a few jobs (the one that just arrived, the members of a group a job
just left, a member at SLO risk) and proposes relocations at iteration boundaries:

- **single move**: take job m out of its group G (releasing the nodes only m uses, or all of G
  when m is alone) and place it where the policy puts it with G excluded;
- **pair merge**: two jobs that each sit alone become one disaggregated group (the first keeps
  an isolated shape, the second joins it) when that is cheaper than the two lone groups;
- **pool merge** (`PolicyConfig.pool_merge`): two lone *elastic* jobs (`JobSpec.elastic`) become
  one disaggregated group on *both* their training nodes (none bought): each Train stretches over
  the pooled nodes, the Rollouts run on the cheap rollout pool. A job with a fixed world size
  (veRL, ROLL) would train on its own nodes only, so pooling buys it nothing: never proposed. It costs more $/h than the lone groups and saves $ per
  iteration done (jobs end sooner), so it is weighed over the pair's remaining run;
- **pull move** (`PolicyConfig.pull_moves`): when no member of a group the plan looks at moves, a job
  alone in another group joins that group (releasing its own), priced as a single move.

A relocation costs what the real system pays: stop at an iteration boundary, checkpoint, restart
the actors on other nodes and reload state (`relocation_s`: `restart_s` plus rollout and train
state per node over `checkpoint_gb_s`). A move is taken only when its saving over the job's
remaining run is at least `regroup_payback` times the job's own $ for that downtime, and when the
downtime fits the job's SLO slack over its remaining iterations. The simulator charges the
downtime to the moved job. The plan is pure data; `apply_moves` carries it out on a ClusterState.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from rollmux.coordinator.policy import modes
from rollmux.coordinator.policy.api import PlacementDecision, PolicyConfig, Strategy
from rollmux.coordinator.policy.intra_group import member_periods
from rollmux.coordinator.policy.placement import (
    RollMuxPolicy,
    allowed_modes,
    candidates,
    group_prune_reason,
    isolated_cost,
    join_decision,
    slo_check,
    train_scales,
)
from rollmux.coordinator.policy.state import ClusterState, GroupState, Member, PhaseProfile
from rollmux.core.model import GB, Deployment, JobSpec, Pool

RemainingFn = Callable[[str], float]
"""job name -> seconds of solo-speed work it still has to do (0 when unknown: never moved)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """Relocate `job` out of `from_group` into `decision` (applied after it leaves)."""

    job: str
    from_group: str
    decision: PlacementDecision
    saving_usd_per_h: float  # cluster $/h before minus after the whole plan step this move belongs to
    downtime_s: float  # checkpoint + restart + reload the job pays
    reason: str


def relocation_s(job: JobSpec, config: PolicyConfig) -> float:
    """Seconds a relocated job makes no progress: restart plus checkpoint and reload of its state."""
    state_gb = ((job.rollout_state_bytes or 0) + (job.train_state_bytes or 0)) / GB
    return config.restart_s + state_gb / config.checkpoint_gb_s


def freed_usd_per_h(group: GroupState, name: str) -> float:
    """$/h released if member `name` leaves `group` (its exclusive rollout and training nodes, or the
    whole group; `GroupState.remove_member` releases the same)."""
    if len(group.members) == 1:
        return group.usd_per_h
    c = group._cluster  # noqa: SLF001  (same package: the group's own price table)
    alone = sum(1 for n in group.members[name].rollout_nodes if group.rollout[n].jobs == [name])
    others = {n for other, m in group.members.items() if other != name for n in m.train_nodes}
    train_alone = sum(1 for n in group.train_nodes if n not in others)
    return alone * c.node_usd_per_h(Pool.ROLLOUT) + train_alone * c.node_usd_per_h(group.train_pool)


def move_cap(state: ClusterState, config: PolicyConfig, name: str) -> int:
    """Relocations job `name` may take over its life (the simulator and the live coordinator both ask).

    `PolicyConfig.max_moves_per_job`, plus one for a pool merge's survivor with `pool_return` (alone in
    a training pool larger than it needs because its partner ended: the pool merge priced in its return
    to a lone group).
    """
    group = state.groups.get(state.job_group.get(name, ""))
    survivor = (config.pool_return and group is not None and len(group.members) == 1
                and len(group.train_nodes) > group.max_member_train_nodes)
    return config.max_moves_per_job + int(survivor)


SLACK_SHARE = 0.25
"""Share of the SLO slack left after a move that its downtime may use (runtime times are shorter
than the plan's, so a realised solo iteration is the stricter yardstick)."""


def _worth_it(job: JobSpec, saving: float, downtime_s: float, remaining_s: float, config: PolicyConfig,
              state: ClusterState, slowdown_after: float = 1.0, stall_usd_per_h: float = 0.0) -> bool:
    """Saving over the remaining run >= payback x the $ the downtime costs, and SLO slack left.

    The downtime costs the job's own $ (an isolated group's), or `stall_usd_per_h` where more: the
    group it joins waits for it in the round-robin order (its first phase comes late), so that
    group's whole $/h is idle for the downtime. `slowdown_after` is the job's planned slowdown where
    it goes; the downtime must fit in `SLACK_SHARE` of what its SLO still allows over its remaining
    run at that slowdown.
    """
    if saving <= 1e-9 or remaining_s <= 0:
        return False
    own = max(isolated_cost(job, state.cluster), stall_usd_per_h)
    if saving * remaining_s < config.regroup_payback * own * downtime_s:
        return False
    return downtime_s <= SLACK_SHARE * (job.slo - slowdown_after) * remaining_s


def work_rate(group: GroupState, without: str | None = None) -> float:
    """Solo-seconds of work `group`'s members (less `without`) get done per second: sum of T_solo / period."""
    members = [m for n, m in group.members.items() if n != without]
    if not members:
        return 0.0
    periods = member_periods([m.timing() for m in members])
    return sum(m.profile.t_solo_s / periods[m.spec.name] for m in members if periods[m.spec.name] > 0)


def _rate_in(decision: PlacementDecision, state: ClusterState, job: JobSpec) -> tuple[float, float]:
    """(work rate before, after) of the group `decision` puts `job` in (a new one: 0 before)."""
    periods = decision.t_coexec_s
    after = job.t_solo_s / periods.get(job.name, job.t_solo_s)
    group = state.groups.get(decision.group_id) if decision.group_id is not None else None
    if group is None:
        return 0.0, after
    before = work_rate(group)
    return before, after + sum(m.profile.t_solo_s / periods.get(n, m.budget_s) for n, m in group.members.items())


def work_saving(usd_before: float, rate_before: float, usd_after: float, rate_after: float) -> float:
    """$/h a change saves at equal throughput: cost before less cost after scaled to the work rate
    before (and never more than the plain $/h it saves, so a move never raises $/h).

    Occupancy-aware: a move that halves $/h but also halves the work the groups get done (two
    co-located jobs time-slicing one pool) saves nothing, as the jobs then run twice as long.
    """
    raw = usd_before - usd_after
    if rate_after <= 0:
        return raw
    return min(raw, usd_before - usd_after * rate_before / rate_after)


def _slowdown(decision: PlacementDecision, job: JobSpec, profile: PhaseProfile | None = None) -> float:
    """The job's predicted slowdown where `decision` puts it, against its learned solo iteration if known."""
    t_solo = profile.t_solo_s if profile is not None and profile.learned else job.t_solo_s
    return decision.t_coexec_s.get(job.name, t_solo) / t_solo


def _learned(profile: PhaseProfile) -> PhaseProfile | None:
    return profile if profile.learned else None


def plan_moves(state: ClusterState, policy: RollMuxPolicy, jobs: Sequence[str], remaining: RemainingFn,
               pull: bool = True) -> list[Move]:
    """Relocations worth making for `jobs` (names of placed jobs), best first; at most one per job.

    `pull`: also look for pull moves into their groups (`PolicyConfig.pull_moves`); an arrival's plan
    passes False: an arrival takes room in its group, it opens none (a new group's lone job is
    already weighed for pair merges)."""
    if not policy.config.regroup:
        return []
    for name in jobs:
        gid = state.job_group.get(name)
        if gid is None:
            continue
        moves = _moves_for(state, policy, name, gid, remaining)
        if moves:
            return moves  # the state changes once a plan is applied; the caller asks again
    if pull and policy.config.pull_moves:
        for gid in dict.fromkeys(state.job_group[n] for n in jobs if n in state.job_group):
            pulled = _pull_move(state, policy, gid, remaining)
            if pulled:
                return pulled
    return []


def place_arrival(state: ClusterState, policy: RollMuxPolicy, job: JobSpec, remaining: RemainingFn,
                  decision: PlacementDecision | None = None,
                  allocate: Callable[[Pool, int], list[str]] | None = None) -> tuple[PlacementDecision, GroupState, list[Move]]:
    """An arrival: its placement (or `decision`, one already made for it), applied, then its regroup
    plan (`plan_moves` without pull moves), in one pass over the fleet. Returns the decision, the
    group it joined and the plan (not applied).

    Why one pass: the plan's single move places the job again with its new group excluded, which
    evaluates every other group for the same job once more; inside one memo (`RollMuxPolicy.memoized`)
    those evaluations are read back instead, so the arrival's tail is one fleet scan, not two. The
    decisions are those of `place` then `plan_moves`: the memo holds only groups the plan does not
    change, the joined group's entries are dropped once it changes.
    """
    with policy.memoized():
        if decision is None:
            decision = policy.place(job, state)
        group = state.apply(job, decision, allocate)
        policy.forget(group)
        moves = plan_moves(state, policy, [job.name], remaining, pull=False) if policy.config.regroup else []
    return decision, group, moves


def _moves_for(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining: RemainingFn) -> list[Move]:
    """The single move, pair merge or pool merge for `name`: the first that pays, or with
    `best_move` the one saving the most $ over its horizon (the job's remaining run for a single
    move, the shorter remaining run of the pair for a merge)."""
    plans = (lambda: _single_move(state, policy, name, gid, remaining(name)),
             lambda: _pair_merge(state, policy, name, gid, remaining),
             lambda: _pool_merge(state, policy, name, gid, remaining))
    if not policy.config.best_move:
        return next((moves for plan in plans if (moves := plan())), [])
    best: tuple[float, list[Move]] | None = None
    for plan in plans:
        moves = plan()
        if moves:
            horizon = remaining(name) if len(moves) == 1 else min(remaining(m.job) for m in moves)
            gain = moves[0].saving_usd_per_h * horizon
            if best is None or gain > best[0]:
                best = (gain, moves)
    return best[1] if best else []


def _single_move(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining_s: float) -> list[Move] | None:
    group = state.groups[gid]
    member = group.members[name]
    freed = freed_usd_per_h(group, name)
    if freed <= 0:
        return None
    spec = member.spec
    decision = policy.place(spec, state, exclude=gid, profile=_learned(member.profile))
    to_before, to_after = _rate_in(decision, state, spec)
    from_before, from_after = work_rate(group), work_rate(group, without=name)
    target = state.groups.get(decision.group_id) if decision.group_id is not None else None
    usd_before = group.usd_per_h + (target.usd_per_h if target is not None else 0.0)
    saving = work_saving(usd_before, from_before + to_before,
                         usd_before - freed + decision.delta_usd_per_h, from_after + to_after)
    down = relocation_s(spec, policy.config)
    stall = (target.usd_per_h if target is not None else 0.0) + decision.delta_usd_per_h
    if not _worth_it(spec, saving, down, remaining_s, policy.config, state, _slowdown(decision, spec, member.profile),
                     stall):
        return None
    return [Move(job=name, from_group=gid, decision=decision, saving_usd_per_h=saving, downtime_s=down,
                 reason=f"frees ${freed:,.2f}/h in {gid}, costs +${decision.delta_usd_per_h:,.2f}/h "
                        f"{decision.deployment.value} in {decision.group_id or 'a new group'}")]


def _pull_move(state: ClusterState, policy: RollMuxPolicy, gid: str, remaining: RemainingFn) -> list[Move] | None:
    """A job alone in another group joins `gid` (pull), releasing its whole group: the move saving
    the most over its remaining run, if any pays.

    Why: a single move is only looked for at the moving job's own events (its arrival, its group's
    learning or departure events), so room that opens in `gid` later (a member left, members'
    learned times shrank its period) stayed unused by lone jobs that arrived before it opened.
    """
    target = state.groups.get(gid)
    if target is None or not target.members:
        return None
    config, cluster = policy.config, state.cluster
    best: tuple[float, list[Move]] | None = None
    priced = 0  # lone jobs checked against the group's schedule (`PolicyConfig.merge_candidates`)
    for lone, name, member in _lone_jobs(state, but=gid):
        rem = remaining(name)
        if rem <= 0:
            continue
        spec = member.spec
        profile = _learned(member.profile) or policy.initial_profile(spec)
        allowed = allowed_modes(spec, config)
        if group_prune_reason(target, spec, config, allowed, profile) is not None:
            continue
        priced += 1
        if config.merge_candidates is not None and priced > config.merge_candidates:
            break
        cands, _ = candidates(target, spec, cluster, allowed, train_scales(target, spec, config, allowed))
        for cand in cands:
            delta = cand.delta_usd_per_h(cluster)
            if delta >= lone.usd_per_h:
                break  # cheapest first: nothing further saves $/h
            periods, rejected = slo_check(cand, spec, config, profile)
            if rejected is not None or periods is None:
                continue
            decision = join_decision(spec, cand, delta, periods, (), reason=f"pulled into {gid} at +${delta:,.2f}/h")
            to_before, to_after = _rate_in(decision, state, spec)
            usd_before = lone.usd_per_h + target.usd_per_h
            saving = work_saving(usd_before, work_rate(lone) + to_before, target.usd_per_h + delta, to_after)
            gain = saving * rem
            if (best is None or gain > best[0]) and _worth_it(
                    spec, saving, relocation_s(spec, config), rem, config, state,
                    _slowdown(decision, spec, member.profile), target.usd_per_h + delta):
                best = (gain, [Move(job=name, from_group=lone.group_id, decision=decision, saving_usd_per_h=saving,
                                    downtime_s=relocation_s(spec, config),
                                    reason=f"frees ${lone.usd_per_h:,.2f}/h in {lone.group_id}, costs "
                                           f"+${delta:,.2f}/h {cand.deployment.value} in {gid}")])
            break
    return best[1] if best else None


def _lone_jobs(state: ClusterState, but: str) -> Iterator[tuple[GroupState, str, Member]]:
    """(group, job name, member) of every group but `but` that holds exactly one job."""
    for other in state.groups.values():
        if other.group_id != but and len(other.members) == 1:
            (name, member), = other.members.items()
            yield other, name, member


def _pair_merge(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining: RemainingFn) -> list[Move] | None:
    """`name` alone in `gid` and another job alone elsewhere: one disaggregated group for both?"""
    group = state.groups[gid]
    if len(group.members) != 1:
        return None
    a = group.members[name].spec
    config = policy.config
    best: tuple[float, list[Move]] | None = None
    priced = 0  # candidates priced exactly (`PolicyConfig.merge_candidates`)
    for other, b_name, b_member in _lone_jobs(state, but=gid):
        b = b_member.spec
        if Deployment.DISAGGREGATED not in _allowed(a, config) or Deployment.DISAGGREGATED not in _allowed(b, config):
            continue
        if not _pair_may_pay(a, b, group.usd_per_h + other.usd_per_h, state):
            continue
        priced += 1
        if config.merge_candidates is not None and priced > config.merge_candidates:
            break
        prof = {name: group.members[name].profile, b_name: b_member.profile}
        cost = _pair_cost(a, b, state, prof)
        if cost is None:
            continue
        iso, join = cost[1], cost[2]
        rate_after = sum(prof[n].t_solo_s / join.t_coexec_s.get(n, prof[n].t_solo_s) for n in prof)
        saving = work_saving(group.usd_per_h + other.usd_per_h, work_rate(group) + work_rate(other), cost[0], rate_after)
        if best is not None and saving <= best[0]:
            continue
        da, db = relocation_s(a, config), relocation_s(b, config)
        lone = {name: group.usd_per_h, b_name: other.usd_per_h}
        rem = {name: remaining(name), b_name: remaining(b_name)}
        shared_s = min(rem.values())
        if shared_s <= 0:
            continue
        # The pair lasts until the shorter job ends; the survivor then holds the pair's group, which
        # may cost more than the group it left: that excess counts against, over the rest of its run
        # or until one more move puts it back in a lone group of that price, whichever costs less.
        longer = max(rem, key=lambda n: rem[n])
        spec_l = a if longer == name else b
        move_back = max(isolated_cost(spec_l, state.cluster), cost[0]) * relocation_s(spec_l, config)
        total = saving * shared_s - min(max(0.0, cost[0] - lone[longer]) * (rem[longer] - shared_s), move_back)
        if total <= 0 or not all(
                _worth_it(sp, total / 2 / rem[sp.name], relocation_s(sp, config), rem[sp.name], config, state,
                          _slowdown(join, sp, prof[sp.name]), cost[0])  # the join's periods cover both
                for sp in (a, b)):
            continue
        where = {name: gid, b_name: other.group_id}
        down = {name: da, b_name: db}
        why = f"{name} and {b_name} alone (${group.usd_per_h + other.usd_per_h:,.2f}/h) share one group (${cost[0]:,.2f}/h)"
        best = (saving, [Move(job=d.job, from_group=where[d.job], decision=d, saving_usd_per_h=saving,
                              downtime_s=down[d.job], reason=why) for d in (iso, join)])
    return best[1] if best else None


def _allowed(job: JobSpec, config: PolicyConfig) -> tuple[Deployment, ...]:
    return allowed_modes(job, config)


_PAIR_GROUP = "<pair>"


def _pair_may_pay(a: JobSpec, b: JobSpec, alone_usd_per_h: float, state: ClusterState) -> bool:
    """Cheap necessary conditions for a pair merge: it could cost less, and the shared training pool
    (the larger job's) could carry both Trains within the tighter SLO budget."""
    c = state.cluster
    t_nodes = max(c.nodes_for(a.n_train_gpus), c.nodes_for(b.n_train_gpus))
    r_nodes = max(c.nodes_for(a.n_rollout_gpus), c.nodes_for(b.n_rollout_gpus))
    if t_nodes * c.node_usd_per_h(Pool.TRAIN) + r_nodes * c.node_usd_per_h(Pool.ROLLOUT) >= alone_usd_per_h - 1e-9:
        return False
    gpus = t_nodes * c.gpus_per_node
    t_a = (a.t_train_s or 0.0) * modes.train_stretch(a, gpus)
    t_b = (b.t_train_s or 0.0) * modes.train_stretch(b, gpus)
    lower = max(t_a + t_b, (a.t_roll_s or 0.0) + t_a, (b.t_roll_s or 0.0) + t_b)
    return lower <= min(a.slo * a.t_solo_s, b.slo * b.t_solo_s) * (1 + 1e-9)


def _pair_cost(a: JobSpec, b: JobSpec, state: ClusterState, profiles: dict[str, PhaseProfile] | None = None,
               pooled: bool = False) -> tuple[float, PlacementDecision, PlacementDecision] | None:
    """$/h of a disaggregated group holding a (isolated shape) and then b, with both decisions; None if infeasible.

    The group trains on a's training nodes, or with `pooled` on a's and b's together (pool merge).
    `profiles` (job -> the profile it runs with now, learned where confident) plan the pair's SLO check;
    planned worst-case times without them.
    """
    cluster = state.cluster
    if b.n_train_gpus > a.n_train_gpus:
        a, b = b, a  # the larger training pool hosts the pair (the pool is never grown)
    if cluster.nodes_for(b.n_train_gpus) > cluster.nodes_for(a.n_train_gpus):
        return None
    r_nodes = tuple(f"{_PAIR_GROUP}r{i}" for i in range(cluster.nodes_for(a.n_rollout_gpus)))
    t_count = cluster.nodes_for(a.n_train_gpus) + (cluster.nodes_for(b.n_train_gpus) if pooled else 0)
    scratch = GroupState(_PAIR_GROUP, cluster, tuple(f"{_PAIR_GROUP}t{i}" for i in range(t_count)),
                         cluster.host_dram_bytes)
    for n in r_nodes:
        scratch.add_rollout_node(n, cluster.host_dram_bytes)
    scratch.add_member(a, r_nodes, Deployment.DISAGGREGATED)
    if profiles and a.name in profiles:
        scratch.set_profile(a.name, profiles[a.name])
    if scratch.train_dram_used_bytes + (b.train_state_bytes or 0) >= scratch.train_dram_bytes:
        return None
    node_price = cluster.node_usd_per_h(Pool.ROLLOUT)
    cands, _ = candidates(scratch, b, cluster, (Deployment.DISAGGREGATED,))
    for cand in cands:
        periods, rejected = slo_check(cand, b, PolicyConfig(), (profiles or {}).get(b.name))
        if rejected is None and periods is not None:
            iso = PlacementDecision(job=a.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                                    new_rollout_nodes=len(r_nodes), new_train_nodes=len(scratch.train_nodes),
                                    delta_usd_per_h=scratch.usd_per_h, reason="pair merge: first of two")
            join = PlacementDecision(job=b.name, strategy=cand.strategy, group_id=_PAIR_GROUP,
                                     rollout_nodes=cand.existing_nodes, new_rollout_nodes=cand.new_nodes,
                                     new_train_nodes=0, delta_usd_per_h=cand.new_nodes * node_price,
                                     t_coexec_s=periods, reason=f"pair merge: joins {a.name}")
            return scratch.usd_per_h + cand.new_nodes * node_price, iso, join
    return None


def _pool_may_pay(pa: PhaseProfile, a: JobSpec, pb: PhaseProfile, b: JobSpec, round_usd: float,
                  state: ClusterState) -> bool:
    """Cheap necessary conditions for a pool merge: the pooled group's $ for one iteration of each job
    (at a lower bound of its period) beats the lone groups', and that period fits the tighter budget."""
    c = state.cluster
    t_nodes = c.nodes_for(a.n_train_gpus) + c.nodes_for(b.n_train_gpus)
    gpus = t_nodes * c.gpus_per_node
    t_a, t_b = pa.t_train_s * modes.train_stretch(a, gpus), pb.t_train_s * modes.train_stretch(b, gpus)
    serial = a.elastic or b.elastic  # an elastic Train holds every pooled node; fixed ones run side by side
    lower = max(t_a + t_b if serial else 0.0, pa.t_roll_s + t_a, pb.t_roll_s + t_b)
    usd = (t_nodes * c.node_usd_per_h(Pool.TRAIN)
           + max(c.nodes_for(a.n_rollout_gpus), c.nodes_for(b.n_rollout_gpus)) * c.node_usd_per_h(Pool.ROLLOUT))
    return usd * lower < round_usd and lower <= min(a.slo * pa.t_solo_s, b.slo * pb.t_solo_s) * (1 + 1e-9)


def _pool_merge(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining: RemainingFn) -> list[Move] | None:
    """`name` alone in `gid` and another lone job: one disaggregated group on both jobs' training nodes?

    The pair keeps every training node the two lone groups had (none is bought) and shares one set
    of rollout nodes (the larger job's shape; the second job direct-packs or scales them). An elastic
    member's Train stretches over the pooled nodes, so the pool runs both Trains back to back
    while their Rollouts run on the cheap rollout pool: $/h goes up, the work done per $ more. Jobs
    with a fixed world size each train on their own nodes of the pool, side by side (per-node
    queues), and share the rollout nodes: the pair saves the second job's rollout nodes.
    Taken when the $ it saves over the pair's remaining run (the survivor going back to a lone
    group of its old price once the shorter job ends) is `regroup_payback` times the group's $ for
    the downtime, and the downtime fits each job's SLO slack, as for the other moves.
    """
    group = state.groups[gid]
    config = policy.config
    if not config.pool_merge or len(group.members) != 1:
        return None
    a_member = group.members[name]
    a = a_member.spec
    n_a = remaining(name) / a.t_solo_s  # iterations left
    if n_a <= 0 or Deployment.DISAGGREGATED not in _allowed(a, config):
        return None
    p_a = a_member.t_roll_s + a_member.t_train_in_group_s
    best: tuple[float, list[Move]] | None = None
    priced = 0  # candidates priced exactly (`PolicyConfig.merge_candidates`)
    for other, b_name, b_member in _lone_jobs(state, but=gid):
        b = b_member.spec
        n_b = remaining(b_name) / b.t_solo_s
        if n_b <= 0 or Deployment.DISAGGREGATED not in _allowed(b, config):
            continue
        p_b = b_member.t_roll_s + b_member.t_train_in_group_s  # a lone group runs at its member's own cycle
        if not _pool_may_pay(a_member.profile, a, b_member.profile, b, group.usd_per_h * p_a + other.usd_per_h * p_b,
                             state):
            continue
        priced += 1
        if config.merge_candidates is not None and priced > config.merge_candidates:
            break
        prof = {name: a_member.profile, b_name: b_member.profile}
        cost = _pair_cost(a, b, state, prof, pooled=True)
        if cost is None:
            continue
        usd, iso, join = cost
        period = max(join.t_coexec_s.values())
        # $ x s / h over the pair's remaining run, before and after (the survivor moves back alone).
        before = group.usd_per_h * n_a * p_a + other.usd_per_h * n_b * p_b
        shared = min(n_a, n_b)
        survivor, n_s, lone_usd, p_s = ((a, n_a - shared, group.usd_per_h, p_a) if n_a >= n_b
                                        else (b, n_b - shared, other.usd_per_h, p_b))
        after = usd * shared * period + (lone_usd * (n_s * p_s + relocation_s(survivor, config)) if n_s > 0 else 0.0)
        down = {name: relocation_s(a, config), b_name: relocation_s(b, config)}
        gain = (before - after) / 3600.0
        if gain <= config.regroup_payback * usd * max(down.values()) / 3600.0 or (best is not None and gain <= best[0]):
            continue
        if not all(down[sp.name] <= SLACK_SHARE * (sp.slo - _slowdown(join, sp, prof[sp.name])) * remaining(sp.name)
                   for sp in (a, b)):
            continue
        where = {name: gid, b_name: other.group_id}
        why = (f"{name} and {b_name} alone (${group.usd_per_h + other.usd_per_h:,.2f}/h) pool their training nodes "
               f"in one group (${usd:,.2f}/h, period {period:.0f} s): saves ${gain:,.0f} over their run")
        best = (gain, [Move(job=d.job, from_group=where[d.job], decision=d, saving_usd_per_h=gain * 3600.0 / max(shared * period, 1.0),
                            downtime_s=down[d.job], reason=why) for d in (iso, join)])
    return best[1] if best else None


def apply_moves(state: ClusterState, moves: Sequence[Move]) -> list[str]:
    """Carry out `moves` in order; returns the node ids released. A pair's second move joins the first's new group."""
    released: list[str] = []
    specs = {m.job: state.groups[m.from_group].members[m.job].spec for m in moves}  # the submitted specs
    for m in moves:
        released += state.remove_job(m.job)
    pair: GroupState | None = None
    for m in moves:
        decision = m.decision
        if decision.group_id == _PAIR_GROUP:
            assert pair is not None, "a pair merge's join comes after its isolated move"
            real = list(pair.rollout)  # scratch node i is the pair group's i-th rollout node
            decision = replace(decision, group_id=pair.group_id,
                               rollout_nodes=tuple(real[int(n.removeprefix(f"{_PAIR_GROUP}r"))] for n in decision.rollout_nodes))
        group = state.apply(specs[m.job], decision)
        if decision.strategy is Strategy.ISOLATED:
            pair = group
    return released


def merge_join(state: ClusterState, job: JobSpec, group_id: str, profile: PhaseProfile | None = None) -> PlacementDecision | None:
    """The second half of a pair or pool merge once its first half opened `group_id`: `job` joins it
    disaggregated by the cheapest candidate that meets every member's SLO, as `_pair_cost` planned
    it on its scratch group; None when none does any more (or the group is gone).

    An executor that switches the two jobs one at a time, each at its own iteration boundary (the
    live coordinator), re-checks the join with it when the second job acknowledges; `apply_moves`,
    which switches both at once, needs no re-check. `profile` is the job's current one.
    """
    group = state.groups.get(group_id)
    if group is None or not group.allows(Deployment.DISAGGREGATED) or not group.train_available:
        return None
    if group.train_dram_used_bytes + (job.train_state_bytes or 0) >= group.train_dram_bytes:
        return None
    node_price = state.cluster.node_usd_per_h(Pool.ROLLOUT)
    cands, _ = candidates(group, job, state.cluster, (Deployment.DISAGGREGATED,))
    for cand in cands:
        periods, rejected = slo_check(cand, job, PolicyConfig(), profile)
        if rejected is None and periods is not None:
            return PlacementDecision(job=job.name, strategy=cand.strategy, group_id=group_id,
                                     rollout_nodes=cand.existing_nodes, new_rollout_nodes=cand.new_nodes,
                                     new_train_nodes=0, delta_usd_per_h=cand.new_nodes * node_price,
                                     t_coexec_s=periods, reason=f"merge: joins {group_id}")
    return None


RISK_MARGIN = 1.0
"""A member is at risk when its predicted period exceeds this share of its SLO budget. The period is
planned on high-percentile (learned) or worst-case times, so it already sits above the realised one;
rescuing at 0.97 of the budget moved jobs that would have met their SLO and cost more (policy_matrix:
balanced U(1,2) seed 1 1.144x -> 1.167x vs Colocate and SLO vs realised 99.0% -> 99.5% at 1.0)."""


def slo_risks(group: GroupState, config: PolicyConfig) -> list[str]:
    """Members whose predicted period (current profiles, learned where confident) nears their SLO, worst first."""
    if not group.members:
        return []
    periods = member_periods(group.timings())
    over = {n: periods[n] / m.budget_s for n, m in group.members.items() if periods[n] > m.budget_s * RISK_MARGIN}
    return sorted(over, key=lambda n: -over[n])


def plan_rescue(state: ClusterState, policy: RollMuxPolicy, name: str, remaining_s: float) -> list[Move]:
    """Move member `name`, whose SLO is at risk in its group, to wherever the policy now places it.

    It is planned with its learned times; an SLO outranks cost, so the move is taken whatever it
    saves, but only if its downtime fits the SLO slack it will have there over `remaining_s`
    (else moving would break the SLO it is meant to save). Returns [] to leave it where it is.
    """
    gid = state.job_group[name]
    member = state.groups[gid].members[name]
    spec = member.spec
    decision = policy.place(spec, state, exclude=gid, profile=_learned(member.profile))
    down = relocation_s(member.spec, policy.config)
    if down > SLACK_SHARE * (spec.slo - _slowdown(decision, spec, member.profile)) * remaining_s:
        return []
    freed = freed_usd_per_h(state.groups[gid], name)
    return [Move(job=name, from_group=gid, decision=decision, saving_usd_per_h=freed - decision.delta_usd_per_h,
                 downtime_s=down, reason=f"SLO risk in {gid}: moves to {decision.deployment.value} in {decision.group_id or 'a new group'}")]


STATIC_REMAINING_S = 1e9
"""Remaining work assumed for every job of a static batch (nothing has started: a move costs nothing real)."""


def place_batch(jobs: Sequence[JobSpec], state: ClusterState, policy: RollMuxPolicy,
                lookahead: bool = True) -> tuple[list[PlacementDecision], list[Move]]:
    """Place jobs that wait together (a batch, an admission window), regrouping after each.

    With `lookahead` the batch is also tried in decreasing order of size (first-fit decreasing: big
    jobs open the groups small ones fill) on a scratch state, and the cheaper outcome is applied;
    `state` must be empty then. Returns the decisions (in the order applied) and the moves.

    A batch is a fixed-time plan judged in $/h (nothing runs yet): it makes no pool merge (a pool
    merge buys throughput with $/h), no work-aware join check (it trades $/h for work per $ too)
    and keeps no co-execution margin (the margin covers the
    per-iteration variation of a running schedule; the offline optimum it is compared with plans on
    fixed times too).
    """
    if policy.config.pool_merge or policy.config.coexec_margin or policy.config.coexec_margin_big or policy.config.work_aware:
        policy = RollMuxPolicy(replace(policy.config, pool_merge=False, coexec_margin=0.0, coexec_margin_big=0.0,
                                       work_aware=False))
    if lookahead and not state.groups and len(jobs) > 1:
        big_first = sorted(jobs, key=lambda j: (-isolated_cost(j, state.cluster), -j.t_solo_s))
        trial = ClusterState(state.cluster)
        _place_in_order(big_first, trial, policy)
        plain = ClusterState(state.cluster)
        _place_in_order(jobs, plain, policy)
        order = big_first if trial.usd_per_h < plain.usd_per_h - 1e-9 else list(jobs)
        return _place_in_order(order, state, policy)
    return _place_in_order(jobs, state, policy)


def _place_in_order(jobs: Sequence[JobSpec], state: ClusterState, policy: RollMuxPolicy) -> tuple[list[PlacementDecision], list[Move]]:
    decisions: list[PlacementDecision] = []
    moves: list[Move] = []
    for job in jobs:
        decision = policy.place(job, state)
        state.apply(job, decision)
        decisions.append(decision)
        step = plan_moves(state, policy, [job.name], lambda _: STATIC_REMAINING_S)
        if step:
            apply_moves(state, step)
            moves += step
    moves += consolidate(state, policy, [j.name for j in jobs])
    return decisions, moves


def consolidate(state: ClusterState, policy: RollMuxPolicy, names: Sequence[str], max_moves: int = 32) -> list[Move]:
    """Local search once a batch is placed: keep moving jobs (latest first) while a move saves $/h."""
    done: list[Move] = []
    while len(done) < max_moves:
        step = plan_moves(state, policy, [n for n in reversed(names) if n in state.job_group],
                          lambda _: STATIC_REMAINING_S)
        if not step:
            return done
        apply_moves(state, step)
        done += step
    return done
