"""The intra-group schedule: round-robin meta-iterations on per-node FIFO queues (paper §4.3).

Each member runs exactly one Rollout and one Train per meta-iteration, in the group's fixed job
order. Rollout(j, i) holds all of j's pinned rollout nodes at once and starts when Train(j, i-1)
(with its sync) has finished and every one of those nodes has served the phases queued before it;
Train(j, i) holds j's training nodes (`MemberTiming.train_nodes`: its own, a fixed world size, or
the whole pool when elastic) and starts when Rollout(j, i) has finished and each of those nodes has
served the trains queued before it. Training nodes are per-node FIFO queues like rollout nodes, as
the live coordinator's rings are (`grants.group_rings`): two members on disjoint training nodes of
one group train at the same time. On-policy order per job is therefore never broken.

Processing phases in (iteration, job order) is a topological order of that precedence graph, so
one pass computes the exact event times; no priority queue is needed. With fixed phase times one
meta-iteration is a max-plus linear map, and the steady-state period T_coexec is its eigenvalue
(`cycle_time`, exact, no transient to wait out); this is what the placement policy checks SLOs
against. With per-iteration times (the simulator's stochastic lengths) the period is measured
over the second half of the simulated horizon.

A co-located member (`MemberTiming.rollout_on_train`) runs its Rollout on the training pool: it
queues there like a Train, in the same round-robin order, so it time-shares the pool with the other
members' phases and mutual exclusion and on-policy order hold unchanged. It has no rollout nodes
and no migration hook (its tail stays where it is).

Long-tail migration (paper §4.3, Fig. 7) is an optional hook: `rollout_release` says when a
Rollout hands its pinned nodes to the next rollout queued on them, which may be before the
Rollout itself ends (its remaining tail was consolidated onto a few GPUs). The job's own Train
still waits for the whole Rollout. Without the hook a Rollout holds its nodes until it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from rollmux.core.model import Phase

PhaseTimeFn = Callable[[int, int, Phase], float]
"""(member index, iteration, phase) -> duration in seconds."""

TRAIN_POOL = "train"
"""The training node of a member that names none: one pool every such member's Train holds whole."""

ReleaseFn = Callable[[int, int], float]
"""(member index, iteration) -> seconds after that Rollout starts at which its pinned rollout nodes
pass to the next rollout in their queues (long-tail migration); clamped to [0, rollout duration]."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberTiming:
    """One group member as the schedule sees it."""

    name: str
    t_roll_s: float  # rollout duration on its pinned nodes
    t_train_s: float  # training duration on the group's training pool (sync included)
    rollout_nodes: tuple[Hashable, ...]  # pinned rollout nodes (any hashable ids); () when co-located
    rollout_on_train: bool = False  # co-located: the Rollout holds its training nodes, like a Train
    train_nodes: tuple[Hashable, ...] = (TRAIN_POOL,)  # training nodes its Train holds (default: one shared pool)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseInterval:
    """One phase execution in the schedule (used for Gantt charts and invariant checks)."""

    job: str
    phase: Phase
    iteration: int
    start_s: float
    end_s: float
    nodes: tuple[Hashable, ...]  # rollout node ids, or the training nodes (Train, co-located Rollout)
    released_s: float | None = None  # Rollout only: when its nodes passed on (migration); None = at end_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleResult:
    periods_s: dict[str, float]  # job -> steady-state co-execution iteration time (T_coexec)
    intervals: tuple[PhaseInterval, ...]  # empty unless recorded
    makespan_s: float  # end of the last phase



def default_horizon(n_members: int) -> int:
    """Meta-iterations simulated: enough for the transient to die out for groups of <= ~10 jobs."""
    return 4 * n_members + 8


def simulate_round_robin(members: Sequence[MemberTiming], *, iterations: int | None = None,
                         phase_time: PhaseTimeFn | None = None, record: bool = False,
                         rollout_release: ReleaseFn | None = None) -> ScheduleResult:
    """Event times of the round-robin meta-iteration schedule.

    Args:
        members: group members in round-robin order.
        iterations: meta-iterations to simulate (default: `default_horizon`).
        phase_time: per-iteration durations; default: each member's fixed times.
        record: keep every phase interval in the result.
        rollout_release: long-tail migration; when each Rollout hands its nodes to the next
            rollout queued on them (default: when it ends). The member's Train still starts
            only after its whole Rollout, so on-policy order is unchanged.

    Returns:
        Steady-state period per member, optional intervals, and the makespan.
    """
    if not members:
        return ScheduleResult(periods_s={}, intervals=(), makespan_s=0.0)
    n_iter = iterations if iterations is not None else default_horizon(len(members))
    node_free: dict[Hashable, float] = {}
    train_free: dict[Hashable, float] = {}
    job_ready = [0.0] * len(members)
    roll_starts: list[list[float]] = [[] for _ in members]
    intervals: list[PhaseInterval] = []
    for it in range(n_iter):
        for idx, m in enumerate(members):
            t_roll = m.t_roll_s if phase_time is None else phase_time(idx, it, Phase.ROLLOUT)
            t_train = m.t_train_s if phase_time is None else phase_time(idx, it, Phase.TRAIN)
            start = job_ready[idx]
            if m.rollout_on_train:
                start = max([start, *(train_free.get(n, 0.0) for n in m.train_nodes)])
                end = released = start + t_roll
                train_free.update(dict.fromkeys(m.train_nodes, end))
            else:
                for n in m.rollout_nodes:
                    start = max(start, node_free.get(n, 0.0))
                end = start + t_roll
                released = end if rollout_release is None else start + min(t_roll, max(0.0, rollout_release(idx, it)))
                for n in m.rollout_nodes:
                    node_free[n] = released
            roll_starts[idx].append(start)
            t_start = max([end, *(train_free.get(n, 0.0) for n in m.train_nodes)])
            job_ready[idx] = t_start + t_train
            train_free.update(dict.fromkeys(m.train_nodes, job_ready[idx]))
            if record:
                migrated = rollout_release is not None and not m.rollout_on_train
                intervals.append(PhaseInterval(job=m.name, phase=Phase.ROLLOUT, iteration=it, start_s=start,
                                               end_s=end, nodes=tuple(m.train_nodes if m.rollout_on_train else m.rollout_nodes),
                                               released_s=released if migrated else None))
                intervals.append(PhaseInterval(job=m.name, phase=Phase.TRAIN, iteration=it, start_s=t_start,
                                               end_s=job_ready[idx], nodes=tuple(m.train_nodes)))
    if phase_time is None and rollout_release is None:
        # Fixed times: the exact steady state, free of any transient the horizon did not outlast.
        periods = member_periods(members)
    else:
        periods = empirical_periods(members, roll_starts, job_ready)
    return ScheduleResult(periods_s=periods, intervals=tuple(intervals), makespan_s=max(job_ready))


def empirical_periods(members: Sequence[MemberTiming], roll_starts: list[list[float]],
                       job_ready: list[float]) -> dict[str, float]:
    """Mean iteration time over the second half of the horizon (per-iteration times vary)."""
    periods = {}
    for idx, m in enumerate(members):
        starts = roll_starts[idx]
        half = len(starts) // 2
        if len(starts) - 1 > half:
            periods[m.name] = (starts[-1] - starts[half]) / (len(starts) - 1 - half)
        else:  # a single iteration: the period is its own duration
            periods[m.name] = job_ready[idx] - starts[0]
    return periods


_NEG = float("-inf")


def _one_iteration_matrix(members: Sequence[MemberTiming]) -> list[list[float]]:
    """The max-plus matrix A of one meta-iteration: x(i+1) = A (x) x(i).

    State variables: when each rollout node, each training node and each job become free. Every
    step of the schedule is a max or a +, so one iteration is max-plus linear; running it on
    symbolic rows (variable -> offset) yields A directly. Nodes of one kind that serve exactly the
    same members are always freed together, so they share one variable (a job's own four nodes
    are one): the matrix, and Karp's cubic search, stay small.
    """
    users: dict[tuple[str, Hashable], list[int]] = {}
    for j, m in enumerate(members):
        for key in [*(("node", n) for n in m.rollout_nodes), *(("train", n) for n in m.train_nodes)]:
            users.setdefault(key, []).append(j)
    var = {key: (key[0], tuple(js)) for key, js in users.items()}  # node -> its class of identical nodes
    roll_vars = [list(dict.fromkeys(var["node", n] for n in m.rollout_nodes)) for m in members]
    train_vars = [list(dict.fromkeys(var["train", n] for n in m.train_nodes)) for m in members]
    index: dict[object, int] = {}
    for v in var.values():
        index.setdefault(v, len(index))
    for j in range(len(members)):
        index[("job", j)] = len(index)
    size = len(index)

    def unit(i: int) -> list[float]:
        row = [_NEG] * size
        row[i] = 0.0
        return row

    def vmax(a: list[float], b: list[float]) -> list[float]:
        return [x if x >= y else y for x, y in zip(a, b)]

    def vadd(a: list[float], c: float) -> list[float]:
        return [x + c for x in a]

    expr = {key: unit(i) for key, i in index.items()}
    for j, m in enumerate(members):
        start = expr[("job", j)]
        if m.rollout_on_train:
            for v in train_vars[j]:
                start = vmax(start, expr[v])
        for v in roll_vars[j]:
            start = vmax(start, expr[v])
        end = vadd(start, m.t_roll_s)
        for v in roll_vars[j]:
            expr[v] = end
        for v in train_vars[j]:
            end = vmax(end, expr[v])
        done = vadd(end, m.t_train_s)
        for v in train_vars[j]:
            expr[v] = done
        expr[("job", j)] = done
    return [expr[key] for key in index]


def _max_cycle_mean(a: list[list[float]]) -> float:
    """Karp's maximum cycle mean of the max-plus matrix `a` (its eigenvalue when irreducible)."""
    n = len(a)
    d = [[0.0] * n]  # D_0 = 0 everywhere: a virtual source reaching every vertex
    for _ in range(n):
        prev = d[-1]
        d.append([max(a[v][u] + prev[u] for u in range(n)) for v in range(n)])
    best = _NEG
    for v in range(n):
        if d[n][v] == _NEG:
            continue
        worst = min((d[n][v] - d[k][v]) / (n - k) for k in range(n) if d[k][v] != _NEG)
        best = max(best, worst)
    return best


def coupled_sets(members: Sequence[MemberTiming]) -> list[list[MemberTiming]]:
    """Members split into sets that share no node (rollout or training), each in round-robin order.

    Within a set every member waits, through some chain of shared nodes, on every other one, so the
    set's one-iteration matrix is irreducible and its members share one period; two sets never
    delay each other (two jobs training on disjoint nodes of one group, on disjoint rollout nodes).
    """
    parent = list(range(len(members)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    holder: dict[tuple[str, Hashable], int] = {}
    for i, m in enumerate(members):
        for key in [*(("node", n) for n in m.rollout_nodes), *(("train", n) for n in m.train_nodes)]:
            if key in holder:
                parent[root(i)] = root(holder[key])
            else:
                holder[key] = i
    sets: dict[int, list[MemberTiming]] = {}
    for i, m in enumerate(members):
        sets.setdefault(root(i), []).append(m)
    return list(sets.values())


def member_periods(members: Sequence[MemberTiming]) -> dict[str, float]:
    """Exact steady-state period of each member under the round-robin schedule: the max-plus
    eigenvalue of its coupled set's matrix (`coupled_sets`), by Karp's maximum cycle mean."""
    out = {}
    for part in coupled_sets(members):
        period = _max_cycle_mean(_one_iteration_matrix(part))
        out.update(dict.fromkeys((m.name for m in part), period))
    return out


def cycle_time(members: Sequence[MemberTiming]) -> float:
    """Exact steady-state period of the round-robin schedule: the longest member period
    (`member_periods`); every member's when they all share one node or pool."""
    if not members:
        return 0.0
    return max(member_periods(members).values())


def t_cycle(members: Sequence[MemberTiming]) -> float:
    """T_cycle = max over members of T_roll + T_train."""
    return max((m.t_roll_s + m.t_train_s for m in members), default=0.0)


def t_load(members: Sequence[MemberTiming]) -> float:
    """T_load = max over nodes of the work queued there per meta-iteration: the T_roll pinned to a
    rollout node; the Trains (and co-located Rollouts) of the members on a training node."""
    per_node: dict[tuple[str, Hashable], float] = {}
    for m in members:
        for n in m.rollout_nodes:
            per_node["node", n] = per_node.get(("node", n), 0.0) + m.t_roll_s
        for n in m.train_nodes:
            per_node["train", n] = per_node.get(("train", n), 0.0) + m.t_train_s + (m.t_roll_s if m.rollout_on_train else 0.0)
    return max(per_node.values(), default=0.0)


def is_saturated(members: Sequence[MemberTiming]) -> bool:
    """Algorithm 1, line 4: a group is saturated when T_load >= T_cycle."""
    return t_load(members) >= t_cycle(members)
