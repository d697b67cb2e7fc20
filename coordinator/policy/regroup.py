"""Regrouping: relocate running jobs between groups when the $ saved pays for the move.

Online placement commits in arrival order and never looks back; groups thin out as members
leave. `plan_moves` looks at a few jobs (the one that just arrived, the members of a group a job
just left, a member at SLO risk) and proposes relocations at iteration boundaries:

- **single move**: take job m out of its group G (releasing the nodes only m uses, or all of G
  when m is alone) and place it where the policy puts it with G excluded;
- **pair merge**: two jobs that each sit alone become one disaggregated group (the first keeps
  an isolated shape, the second joins it) when that is cheaper than the two lone groups.

A relocation costs what the real system pays: stop at an iteration boundary, checkpoint, restart
the actors on other nodes and reload state (`relocation_s`: `restart_s` plus rollout and train
state per node over `checkpoint_gb_s`). A move is taken only when its saving over the job's
remaining run is at least `regroup_payback` times the job's own $ for that downtime, and when the
downtime fits the job's SLO slack over its remaining iterations. The simulator charges the
downtime to the moved job. The plan is pure data; `apply_moves` carries it out on a ClusterState.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rollmux.coordinator.policy.api import PlacementDecision, PolicyConfig, Strategy
from rollmux.coordinator.policy.intra_group import cycle_time
from rollmux.coordinator.policy.placement import RollMuxPolicy, candidates, isolated_cost, slo_check
from rollmux.coordinator.policy.state import ClusterState, GroupState
from rollmux.model import GB, Deployment, JobSpec, Pool

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
    """$/h released if member `name` leaves `group` (its exclusive rollout nodes, or the whole group)."""
    if len(group.members) == 1:
        return group.usd_per_h
    c = group._cluster  # noqa: SLF001  (same package: the group's own price table)
    alone = sum(1 for n in group.members[name].rollout_nodes if group.rollout[n].jobs == [name])
    return alone * c.node_usd_per_h(Pool.ROLLOUT)


SLACK_SHARE = 0.25
"""Share of the SLO slack left after a move that its downtime may use (runtime times are shorter
than the plan's, so a realised solo iteration is the stricter yardstick)."""


def _worth_it(job: JobSpec, saving: float, downtime_s: float, remaining_s: float, config: PolicyConfig,
              state: ClusterState, slowdown_after: float = 1.0) -> bool:
    """Saving over the remaining run >= payback x the job's own $ during the downtime, and SLO slack left.

    `slowdown_after` is the job's planned slowdown where it goes; the downtime must fit in
    `SLACK_SHARE` of what its SLO still allows over its remaining run at that slowdown.
    """
    if saving <= 1e-9 or remaining_s <= 0:
        return False
    own = isolated_cost(job, state.cluster)
    if saving * remaining_s < config.regroup_payback * own * downtime_s:
        return False
    return downtime_s <= SLACK_SHARE * (job.slo - slowdown_after) * remaining_s


def _slowdown(decision: PlacementDecision, job: JobSpec) -> float:
    return decision.t_coexec_s.get(job.name, job.t_solo_s) / job.t_solo_s


def plan_moves(state: ClusterState, policy: RollMuxPolicy, jobs: Sequence[str], remaining: RemainingFn) -> list[Move]:
    """Relocations worth making for `jobs` (names of placed jobs), best first; at most one per job."""
    if not policy.config.regroup:
        return []
    for name in jobs:
        gid = state.job_group.get(name)
        if gid is None:
            continue
        moves = _single_move(state, policy, name, gid, remaining(name)) or _pair_merge(state, policy, name, gid, remaining)
        if moves:
            return moves  # the state changes once a plan is applied; the caller asks again
    return []


def _single_move(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining_s: float) -> list[Move] | None:
    group = state.groups[gid]
    member = group.members[name]
    freed = freed_usd_per_h(group, name)
    if freed <= 0:
        return None
    spec = member.spec
    decision = policy.place(spec, state, exclude=gid)
    saving = freed - decision.delta_usd_per_h
    down = relocation_s(spec, policy.config)
    if not _worth_it(spec, saving, down, remaining_s, policy.config, state, _slowdown(decision, spec)):
        return None
    return [Move(job=name, from_group=gid, decision=decision, saving_usd_per_h=saving, downtime_s=down,
                 reason=f"frees ${freed:,.2f}/h in {gid}, costs +${decision.delta_usd_per_h:,.2f}/h "
                        f"{decision.deployment.value} in {decision.group_id or 'a new group'}")]


def _pair_merge(state: ClusterState, policy: RollMuxPolicy, name: str, gid: str, remaining: RemainingFn) -> list[Move] | None:
    """`name` alone in `gid` and another job alone elsewhere: one disaggregated group for both?"""
    group = state.groups[gid]
    if len(group.members) != 1:
        return None
    a = group.members[name].spec
    config = policy.config
    best: tuple[float, list[Move]] | None = None
    for other in state.groups.values():
        if other.group_id == gid or len(other.members) != 1:
            continue
        (b_name, b_member), = other.members.items()
        b = b_member.spec
        if Deployment.DISAGGREGATED not in _allowed(a, config) or Deployment.DISAGGREGATED not in _allowed(b, config):
            continue
        if not _pair_may_pay(a, b, group.usd_per_h + other.usd_per_h, state):
            continue
        cost = _pair_cost(a, b, state)
        if cost is None:
            continue
        saving = group.usd_per_h + other.usd_per_h - cost[0]
        if best is not None and saving <= best[0]:
            continue
        da, db = relocation_s(a, config), relocation_s(b, config)
        if not (_worth_it(a, saving / 2, da, remaining(name), config, state)
                and _worth_it(b, saving / 2, db, remaining(b_name), config, state)):
            continue
        iso, join = cost[1], cost[2]
        if not all(_worth_it(sp, saving / 2, relocation_s(sp, config), remaining(sp.name), config, state, _slowdown(d, sp))
                   for sp, d in ((a, iso if iso.job == a.name else join), (b, join if join.job == b.name else iso))):
            continue
        where = {name: gid, b_name: other.group_id}
        down = {name: da, b_name: db}
        why = f"{name} and {b_name} alone (${group.usd_per_h + other.usd_per_h:,.2f}/h) share one group (${cost[0]:,.2f}/h)"
        best = (saving, [Move(job=d.job, from_group=where[d.job], decision=d, saving_usd_per_h=saving,
                              downtime_s=down[d.job], reason=why) for d in (iso, join)])
    return best[1] if best else None


def _allowed(job: JobSpec, config: PolicyConfig) -> tuple[Deployment, ...]:
    from rollmux.coordinator.policy.placement import allowed_modes

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
    t_a = (a.t_train_s or 0.0) * a.n_train_gpus / gpus
    t_b = (b.t_train_s or 0.0) * b.n_train_gpus / gpus
    lower = max(t_a + t_b, (a.t_roll_s or 0.0) + t_a, (b.t_roll_s or 0.0) + t_b)
    return lower <= min(a.slo * a.t_solo_s, b.slo * b.t_solo_s) * (1 + 1e-9)


def _pair_cost(a: JobSpec, b: JobSpec, state: ClusterState) -> tuple[float, PlacementDecision, PlacementDecision] | None:
    """$/h of a disaggregated group holding a (isolated shape) and then b, with both decisions; None if infeasible."""
    cluster = state.cluster
    if b.n_train_gpus > a.n_train_gpus:
        a, b = b, a  # the larger training pool hosts the pair (the pool is never grown)
    if cluster.nodes_for(b.n_train_gpus) > cluster.nodes_for(a.n_train_gpus):
        return None
    r_nodes = tuple(f"{_PAIR_GROUP}r{i}" for i in range(cluster.nodes_for(a.n_rollout_gpus)))
    scratch = GroupState(_PAIR_GROUP, cluster, tuple(f"{_PAIR_GROUP}t{i}" for i in range(cluster.nodes_for(a.n_train_gpus))),
                         cluster.host_dram_bytes)
    for n in r_nodes:
        scratch.add_rollout_node(n, cluster.host_dram_bytes)
    scratch.add_member(a, r_nodes, Deployment.DISAGGREGATED)
    if scratch.train_dram_used_bytes + (b.train_state_bytes or 0) >= scratch.train_dram_bytes:
        return None
    node_price = cluster.node_usd_per_h(Pool.ROLLOUT)
    cands, _ = candidates(scratch, b, cluster, (Deployment.DISAGGREGATED,))
    for cand in cands:
        periods, rejected = slo_check(cand, b, PolicyConfig())
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


RISK_MARGIN = 0.97
"""A member is at risk when its predicted period exceeds this share of its SLO budget: the realised
period of random phase times sits above the period of their percentiles' fixed times."""


def slo_risks(group: GroupState, config: PolicyConfig) -> list[str]:
    """Members whose predicted period (current profiles, learned where confident) nears their SLO, worst first."""
    if not group.members:
        return []
    period = cycle_time(group.timings())
    over = {n: period / m.budget_s for n, m in group.members.items() if period > m.budget_s * RISK_MARGIN}
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
    if member.profile.learned:
        spec = replace(spec, t_roll_s=member.profile.t_roll_s, t_train_s=member.profile.t_train_s)
    decision = policy.place(spec, state, exclude=gid, measured=member.profile.learned)
    down = relocation_s(member.spec, policy.config)
    if down > SLACK_SHARE * (spec.slo - _slowdown(decision, spec)) * remaining_s:
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
    """
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
