"""Admission with lookahead: place a job knowing which jobs wait behind it.

`RollMuxPolicy.place` commits one arriving job at its cheapest $/h and never looks back. When several
jobs are pending together (a coordinator that starts with a queue, a fleet that was full), that greedy
choice can block a cheaper arrangement of the next ones: a job that starts alone co-located on its
training nodes is cheapest for itself, but no later job can share that group; a job that takes a
+$0/h join can fill the group the next pending job would have paired into.

`place_pending` compares a few choices for the head job (the policy's own decision, each new group
the job could start, and its other feasible placements in the groups: another pinning, scaling
instead of packing; at most MAX_CHOICES) by what the cluster costs once the next
`PolicyConfig.lookahead_jobs` pending jobs are placed after it (on a large fleet fewer where its
choices are many: `horizon` keeps the placements within LOOKAHEAD_PLACEMENTS), each of those looking ahead the same
way one level less (LOOKAHEAD_DEPTH levels, the last the policy's own decision), all on scratch
forks of the state, and returns the head job's decision of the cheapest outcome (ties to the
policy's own decision). The decision has the shape `place` returns, so the live coordinator's
admission (`runtime.admission`) and the benchmarks call it where they called `place`.
"""

from __future__ import annotations

import copy
import itertools
from collections import ChainMap
from collections.abc import Sequence
from dataclasses import replace

from rollmux.coordinator.policy.api import PlacementDecision, PlacementPolicy
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.state import ClusterState
from rollmux.core.model import JobSpec

LOOKAHEAD_DEPTH = 2
"""Levels of lookahead: the pending jobs after the head are placed looking ahead one level less."""

LOOKAHEAD_GROUPS = 16
"""Groups a lookahead prices its outcomes over: those its choices touch and the latest others (the
rest are what they are whatever the head job does), so its cost does not grow with the cluster."""

MAX_CHOICES = 6
"""Choices for the head job priced by lookahead (its own decision first, then new groups, then joins)."""

LOOKAHEAD_PLACEMENTS = 150
"""On a fleet of more than LOOKAHEAD_GROUPS groups, the most placements (`RollMuxPolicy.place` calls
on scratch forks, bounded by `placements_needed`) one admission decision's lookahead may make: it
looks past fewer pending jobs where it has more choices to price. Why: the cost grows with choices x
pending jobs squared, ~0.3 ms a placement; at 2,000 jobs with 8 pending the uncapped lookahead took
~60-85 ms median, past the 30 ms decision target. A smaller fleet is looked at whole, uncapped: its
placements are cheap, and a head job's choice there decides what the pending jobs can share."""


def placements_needed(choices: int, ahead: int) -> int:
    """Upper bound on the placements a lookahead makes over `ahead` pending jobs for `choices` head
    choices (the policy's own decision included): each pending job is placed once per outcome at
    the first level, and each of its MAX_CHOICES choices prices the jobs after it once more."""
    return choices * (ahead * (1 + MAX_CHOICES) + MAX_CHOICES * ahead * (ahead - 1) // 2)


def horizon(choices: int, pending: int) -> int:
    """How many of `pending` jobs a lookahead with `choices` head choices looks past within
    LOOKAHEAD_PLACEMENTS (at least one)."""
    n = pending
    while n > 1 and placements_needed(choices, n) > LOOKAHEAD_PLACEMENTS:
        n -= 1
    return n


def place_pending(policy: PlacementPolicy, job: JobSpec, state: ClusterState,
                  upcoming: Sequence[JobSpec] = ()) -> PlacementDecision:
    """Where `job` goes when `upcoming` (pending, in admission order) wait behind it. Does not mutate `state`.

    Without upcoming jobs, with `PolicyConfig.lookahead_jobs` 0, or for another policy than RollMux's
    (a baseline), this is `policy.place(job, state)`.
    """
    if not isinstance(policy, RollMuxPolicy) or not upcoming or policy.config.lookahead_jobs == 0:
        return policy.place(job, state)
    decision = policy.place(job, state)
    choices = _choices(policy, job, state, decision)
    ahead = list(upcoming)[: policy.config.lookahead_jobs]
    if len(state.groups) > LOOKAHEAD_GROUPS:
        ahead = ahead[: horizon(1 + len(choices), len(ahead))]
    # The choices touch these groups; later jobs may join any of them or the latest others.
    touched = [d.group_id for d in (decision, *choices) if d.group_id is not None]
    recent = [g for g in reversed(state.groups) if g not in touched][: max(0, LOOKAHEAD_GROUPS - len(touched))]
    view = _fork(state, list(dict.fromkeys(touched + recent[::-1]))) if len(state.groups) > LOOKAHEAD_GROUPS else state
    with policy.memoized():  # the forks share unchanged groups: each (group, job) is evaluated once
        return _best(policy, job, view, ahead, LOOKAHEAD_DEPTH, decision, choices)


def pinned_options(policy: PlacementPolicy, job: JobSpec, state: ClusterState,
                   attach_nodes: Sequence[str]) -> list[PlacementDecision]:
    """Placements of `job` where its ranks already run (I4: the placement is where the job runs), cheapest
    first, ties to joins: its feasible placements in each group that holds one of `attach_nodes`, then
    each new group it could start (whose new nodes the caller takes from `attach_nodes` first). Which of
    them covers every attach node depends on the nodes the caller allocates; the caller tries them in
    order. [] for a policy without options (a baseline): its own decision is all there is.
    """
    if not isinstance(policy, RollMuxPolicy):
        return []
    gids = dict.fromkeys(g for n in attach_nodes if (g := state.node_group.get(n)) is not None)
    joins = [d for gid in gids if gid in state.groups for d in policy.join_options(job, state.groups[gid])]
    alone = policy.alone_options(job, state.cluster)
    ranked = sorted(enumerate([*joins, *alone]), key=lambda kv: (kv[1].delta_usd_per_h, kv[0]))
    return [d for _, d in ranked]


def _decide(policy: RollMuxPolicy, job: JobSpec, state: ClusterState, ahead: list[JobSpec],
            depth: int) -> PlacementDecision:
    decision = policy.place(job, state)
    if not ahead or depth <= 0:
        return decision
    return _best(policy, job, state, ahead, depth, decision, _choices(policy, job, state, decision))


def _best(policy: RollMuxPolicy, job: JobSpec, state: ClusterState, ahead: list[JobSpec], depth: int,
          decision: PlacementDecision, choices: list[PlacementDecision]) -> PlacementDecision:
    """Of `decision` (the policy's own) and `choices`, the one whose outcome with `ahead` costs least."""
    best, best_usd = decision, _outcome_usd(policy, state, job, decision, ahead, depth)
    for choice in choices:
        usd = _outcome_usd(policy, state, job, choice, ahead, depth)
        if usd < best_usd - 1e-6:
            best, best_usd = choice, usd
    if best is decision:
        return decision
    return replace(best, reason=f"lookahead over {len(ahead)} pending job(s): ${best_usd:,.2f}/h with them "
                                f"(the cheapest choice alone would leave more); {best.reason}")


def _choices(policy: RollMuxPolicy, job: JobSpec, state: ClusterState,
             decision: PlacementDecision) -> list[PlacementDecision]:
    """Other feasible decisions for `job`: each new group it could start, then its placements in
    each group (the policy's own decision's group first: another pinning there may leave room for
    the next pending job), at most MAX_CHOICES."""
    key = _key(decision)
    out = [d for d in policy.alone_options(job, state.cluster) if _key(d) != key]
    gids = ([decision.group_id] if decision.group_id in state.groups else []) + [g for g in state.groups if g != decision.group_id]
    for gid in gids:
        if len(out) >= MAX_CHOICES:
            break
        if policy.config.work_aware and gid != decision.group_id:
            continue  # joins the work-aware check refused stay refused
        out += [d for d in policy.join_options(job, state.groups[gid]) if _key(d) != key]
    return out[:MAX_CHOICES]


def _key(d: PlacementDecision) -> tuple[object, ...]:
    return (d.group_id, d.deployment, d.rollout_nodes, d.new_rollout_nodes, d.new_train_nodes, d.train_pool)


def _outcome_usd(policy: RollMuxPolicy, state: ClusterState, job: JobSpec, decision: PlacementDecision,
                 ahead: Sequence[JobSpec], depth: int) -> float:
    """$/h of the cluster once `job` goes by `decision` and `ahead` are placed after it, each looking
    ahead one level less (the last level: the policy's own decision)."""
    scratch = _fork(state)
    _apply(scratch, job, decision)
    for i, nxt in enumerate(ahead):
        _apply(scratch, nxt, _decide(policy, nxt, scratch, list(ahead[i + 1:]), depth - 1))
    return scratch.usd_per_h


def _fork(state: ClusterState, gids: Sequence[str] | None = None) -> ClusterState:
    """A scratch copy of `state` (or of its groups `gids` only) sharing its groups (copy on write,
    `_apply`) and layering its indexes: a fork costs a copy of the group table, not of every group."""
    fork = copy.copy(state)
    fork.groups = dict(state.groups) if gids is None else {g: state.groups[g] for g in gids}
    fork._unsaturated = {g: v for g, v in state._unsaturated.items() if g in fork.groups}  # noqa: SLF001
    fork.job_group = ChainMap({}, state.job_group)  # type: ignore[assignment]
    fork.node_group = ChainMap({}, state.node_group)  # type: ignore[assignment]
    fork._group_seq = copy.copy(state._group_seq)  # noqa: SLF001
    # New nodes get ids no real node has (the live state's nodes are named by their sidecars), shared
    # by every fork of one lookahead so that nested forks never reuse one.
    fork._node_seq = getattr(state, "_lookahead_ids", None) or itertools.count()  # noqa: SLF001
    fork._lookahead_ids = fork._node_seq  # type: ignore[attr-defined]  # noqa: SLF001
    return fork


def _apply(fork: ClusterState, job: JobSpec, decision: PlacementDecision) -> None:
    """`fork.apply`, copying the group it changes first (the groups are shared with the state forked)."""
    gid = decision.group_id
    if gid is not None and gid in fork.groups:
        group = fork.groups[gid]
        fork.groups[gid] = group.clone()
        if gid in fork._unsaturated:  # noqa: SLF001
            fork._unsaturated[gid] = fork.groups[gid]  # noqa: SLF001
    fork.apply(job, decision, allocate=lambda pool, count: [f"<lookahead-{pool.value}-{next(fork._node_seq)}>"  # noqa: SLF001
                                                            for _ in range(count)])
