"""The round-robin schedule run event by event through the grant step, in virtual time.

This is what the live coordinator does, with phase durations given instead of measured: every
member asks for its next phase when the previous one ends, `grants.grant_step` decides what starts,
and a phase frees its nodes when it ends (a Rollout under long-tail migration frees them at its
release time while the job's Train still waits for the whole Rollout). The simulator's driver runs
every group segment through `run_schedule`, so the simulator and the service share one grant rule.

`intra_group.simulate_round_robin` computes the same event times in one topological pass (and
`intra_group.member_periods` their steady state, which the SLO check uses); the property tests check
that the two agree.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rollmux.coordinator.policy.grants import PhaseRequest, Ring, grant_step
from rollmux.coordinator.policy.intra_group import (
    MemberTiming,
    PhaseInterval,
    PhaseTimeFn,
    ReleaseFn,
    ScheduleResult,
    default_horizon,
    empirical_periods,
    member_periods,
)
from rollmux.core.model import Phase

_FREE, _END = 0, 1  # event kinds: nodes pass on; a phase ends (the job asks for its next one)


class _Run:
    """Mutable state of one run: requests, holders, turns and the event heap."""

    def __init__(self, members: Sequence[MemberTiming], n_iter: int, phase_time: PhaseTimeFn | None,
                 release: ReleaseFn | None) -> None:
        self.members, self.n_iter, self.phase_time, self.release = members, n_iter, phase_time, release
        self.names = [m.name for m in members]
        self.index = {m.name: i for i, m in enumerate(members)}
        node_key = {n: f"r{k}" for k, n in enumerate(dict.fromkeys(n for m in members for n in m.rollout_nodes))}
        train_key = {n: f"t{k}" for k, n in enumerate(dict.fromkeys(n for m in members for n in m.train_nodes))}
        self.train_nodes = [tuple(train_key[n] for n in m.train_nodes) for m in members]
        # A co-located Rollout runs on its training nodes, in its job's turn there (the Train follows in the same turn).
        self.nodes = [self.train_nodes[i] if m.rollout_on_train else tuple(node_key[n] for n in m.rollout_nodes)
                      for i, m in enumerate(members)]
        keys = [*node_key.values(), *train_key.values()]
        order = {key: tuple(m.name for m, ks, ts in zip(members, self.nodes, self.train_nodes) if key in ks or key in ts)
                 for key in keys}
        self.rings = {key: Ring(order=o, turn=o[0]) for key, o in order.items()}
        self.holders: dict[str, str] = {}
        self.requests: dict[str, PhaseRequest] = {}
        self.phase = [Phase.ROLLOUT] * len(members)
        self.iteration = [0] * len(members)
        self.ready = [0.0] * len(members)
        self.roll_starts: list[list[float]] = [[] for _ in members]
        self.roll_end = [0.0] * len(members)
        self.intervals: list[PhaseInterval] = []
        self.events: list[tuple[float, int, int, int, tuple[str, ...]]] = []
        self.seq = 0

    def duration(self, idx: int, phase: Phase) -> float:
        m, it = self.members[idx], self.iteration[idx]
        if self.phase_time is not None:
            return self.phase_time(idx, it, phase)
        return m.t_roll_s if phase is Phase.ROLLOUT else m.t_train_s

    def ask(self, idx: int) -> None:
        rollout = self.phase[idx] is Phase.ROLLOUT
        nodes = self.nodes[idx] if rollout else self.train_nodes[idx]
        keeps = rollout and self.members[idx].rollout_on_train  # Rollout then Train, one turn on the pool
        self.requests[self.names[idx]] = PhaseRequest(job=self.names[idx], nodes=nodes, keeps_turn=keeps)

    def push(self, t: float, kind: int, idx: int, nodes: tuple[str, ...] = ()) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, idx, nodes))

    def grant(self, t: float) -> None:
        step = grant_step(self.rings, self.holders, self.requests, usable=self.rings.keys())
        for node, job in step.served.items():
            self.rings[node] = Ring.following(self.rings[node].order, job)
        for g in step.grants:
            idx = self.index[g.job]
            del self.requests[g.job]
            for n in g.nodes:
                self.holders[n] = g.job
            self.start(t, idx, g.nodes)

    def start(self, t: float, idx: int, nodes: tuple[str, ...]) -> None:
        dur = self.duration(idx, self.phase[idx])
        end = t + dur
        if self.phase[idx] is Phase.ROLLOUT:
            self.roll_starts[idx].append(t)
            migrates = self.release is not None and not self.members[idx].rollout_on_train
            free = t + min(dur, max(0.0, self.release(idx, self.iteration[idx]))) if migrates else end  # type: ignore[misc]
            self.roll_end[idx] = end
            self.push(free, _FREE, idx, nodes)
            self.push(end, _END, idx)
            self.record(idx, Phase.ROLLOUT, t, end, free if migrates else None)
        else:
            self.push(end, _FREE, idx, nodes)
            self.push(end, _END, idx)
            self.record(idx, Phase.TRAIN, t, end, None)

    def record(self, idx: int, phase: Phase, start: float, end: float, released: float | None) -> None:
        m = self.members[idx]
        nodes = tuple(m.rollout_nodes) if phase is Phase.ROLLOUT and not m.rollout_on_train else tuple(m.train_nodes)
        self.intervals.append(PhaseInterval(job=self.names[idx], phase=phase, iteration=self.iteration[idx],
                                            start_s=start, end_s=end, nodes=nodes, released_s=released))

    def finish(self, t: float, idx: int) -> None:
        if self.phase[idx] is Phase.ROLLOUT:
            self.phase[idx] = Phase.TRAIN
            self.ask(idx)
            return
        self.ready[idx] = t
        self.phase[idx], self.iteration[idx] = Phase.ROLLOUT, self.iteration[idx] + 1
        if self.iteration[idx] < self.n_iter:
            self.ask(idx)

    def run(self) -> None:
        for idx in range(len(self.members)):
            self.ask(idx)
        self.grant(0.0)
        while self.events:
            t = self.events[0][0]
            while self.events and self.events[0][0] == t:
                _, _, kind, idx, nodes = heapq.heappop(self.events)
                if kind == _FREE:
                    for n in nodes:
                        del self.holders[n]
                else:
                    self.finish(t, idx)
            self.grant(t)


def run_schedule(members: Sequence[MemberTiming], *, iterations: int | None = None,
                 phase_time: PhaseTimeFn | None = None, record: bool = False,
                 rollout_release: ReleaseFn | None = None) -> ScheduleResult:
    """Event times of the round-robin schedule, granted phase by phase through `grant_step`.

    Arguments and result as `intra_group.simulate_round_robin`; intervals come in start order.
    """
    if not members:
        return ScheduleResult(periods_s={}, intervals=(), makespan_s=0.0)
    n_iter = iterations if iterations is not None else default_horizon(len(members))
    run = _Run(members, n_iter, phase_time, rollout_release)
    if n_iter > 0:
        run.run()
    if phase_time is None and rollout_release is None:
        periods = member_periods(members)
    else:
        periods = empirical_periods(members, run.roll_starts, run.ready)
    return ScheduleResult(periods_s=periods, intervals=tuple(run.intervals) if record else (),
                          makespan_s=max(run.ready))
