"""The intra-group schedule: round-robin meta-iterations on per-node FIFO queues (paper §4.3).

Each member runs exactly one Rollout and one Train per meta-iteration, in the group's fixed job
order. Rollout(j, i) holds all of j's pinned rollout nodes at once and starts when Train(j, i-1)
(with its sync) has finished and every one of those nodes has served the phases queued before it;
Train(j, i) holds the whole training pool and starts when Rollout(j, i) has finished and the pool
has served the trains queued before it. On-policy order per job is therefore never broken.

Processing phases in (iteration, job order) is a topological order of that precedence graph, so
one pass computes the exact event times; no priority queue is needed. The steady-state period of
a member is its mean iteration time over the second half of the horizon (the max-plus system is
periodic after a short transient). This is what the placement policy uses as T_coexec, and what
the simulator replays with per-iteration phase times.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from rollmux.model import Phase

PhaseTimeFn = Callable[[int, int, Phase], float]
"""(member index, iteration, phase) -> duration in seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberTiming:
    """One group member as the schedule sees it."""

    name: str
    t_roll_s: float  # rollout duration on its pinned nodes
    t_train_s: float  # training duration on the group's training pool (sync included)
    rollout_nodes: tuple[Hashable, ...]  # pinned rollout nodes (any hashable ids)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseInterval:
    """One phase execution in the schedule (used for Gantt charts and invariant checks)."""

    job: str
    phase: Phase
    iteration: int
    start_s: float
    end_s: float
    nodes: tuple[Hashable, ...]  # rollout node ids, or ("train",) for the training pool


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleResult:
    periods_s: dict[str, float]  # job -> steady-state co-execution iteration time (T_coexec)
    intervals: tuple[PhaseInterval, ...]  # empty unless recorded
    makespan_s: float  # end of the last phase


TRAIN_POOL = "train"


def default_horizon(n_members: int) -> int:
    """Meta-iterations simulated: enough for the transient to die out for groups of <= ~10 jobs."""
    return 4 * n_members + 8


def simulate_round_robin(members: Sequence[MemberTiming], *, iterations: int | None = None,
                         phase_time: PhaseTimeFn | None = None, record: bool = False) -> ScheduleResult:
    """Event times of the round-robin meta-iteration schedule.

    Args:
        members: group members in round-robin order.
        iterations: meta-iterations to simulate (default: `default_horizon`).
        phase_time: per-iteration durations; default: each member's fixed times.
        record: keep every phase interval in the result.

    Returns:
        Steady-state period per member, optional intervals, and the makespan.
    """
    if not members:
        return ScheduleResult(periods_s={}, intervals=(), makespan_s=0.0)
    n_iter = iterations if iterations is not None else default_horizon(len(members))
    node_free: dict[Hashable, float] = {}
    train_free = 0.0
    job_ready = [0.0] * len(members)
    roll_starts: list[list[float]] = [[] for _ in members]
    intervals: list[PhaseInterval] = []
    for it in range(n_iter):
        for idx, m in enumerate(members):
            t_roll = m.t_roll_s if phase_time is None else phase_time(idx, it, Phase.ROLLOUT)
            t_train = m.t_train_s if phase_time is None else phase_time(idx, it, Phase.TRAIN)
            start = job_ready[idx]
            for n in m.rollout_nodes:
                start = max(start, node_free.get(n, 0.0))
            end = start + t_roll
            for n in m.rollout_nodes:
                node_free[n] = end
            roll_starts[idx].append(start)
            t_start = max(end, train_free)
            train_free = job_ready[idx] = t_start + t_train
            if record:
                intervals.append(PhaseInterval(job=m.name, phase=Phase.ROLLOUT, iteration=it, start_s=start,
                                               end_s=end, nodes=tuple(m.rollout_nodes)))
                intervals.append(PhaseInterval(job=m.name, phase=Phase.TRAIN, iteration=it, start_s=t_start,
                                               end_s=train_free, nodes=(TRAIN_POOL,)))
    half = n_iter // 2
    periods = {}
    for idx, m in enumerate(members):
        starts = roll_starts[idx]
        if n_iter - 1 > half:
            periods[m.name] = (starts[-1] - starts[half]) / (n_iter - 1 - half)
        else:  # a single iteration: the period is its own duration
            periods[m.name] = job_ready[idx] - starts[0]
    return ScheduleResult(periods_s=periods, intervals=tuple(intervals), makespan_s=max(job_ready))


def t_cycle(members: Sequence[MemberTiming]) -> float:
    """T_cycle = max over members of T_roll + T_train."""
    return max((m.t_roll_s + m.t_train_s for m in members), default=0.0)


def t_load(members: Sequence[MemberTiming]) -> float:
    """T_load = max(sum of T_train, max over rollout nodes of the T_roll pinned there)."""
    per_node: dict[Hashable, float] = {}
    for m in members:
        for n in m.rollout_nodes:
            per_node[n] = per_node.get(n, 0.0) + m.t_roll_s
    return max(sum(m.t_train_s for m in members), max(per_node.values(), default=0.0))


def is_saturated(members: Sequence[MemberTiming]) -> bool:
    """Algorithm 1, line 4: a group is saturated when T_load >= T_cycle."""
    return t_load(members) >= t_cycle(members)
