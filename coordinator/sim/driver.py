"""Virtual-time replay of a trace through a group placement policy.

The driver is the coordinator's loop with a virtual clock: at each arrival it asks the *same*
`PlacementPolicy` the live coordinator uses for a decision and applies it to a `ClusterState`;
between events each group runs the round-robin meta-iteration schedule through the live
coordinator's grant step (`policy.executor.run_schedule` over `policy.grants.grant_step`), fed
with the runtime model's per-iteration phase times. Membership changes (an arrival joins a group, a job finishes) end the group's current
segment: each member keeps the work it has done, including a partly run phase, and a new
segment starts from there. Groups provision their nodes when created and release them when
they empty, so cost is piecewise constant between events.

Regrouping (`PolicyConfig.regroup`, RollMux only): after an arrival and after a departure the
driver asks `policy.regroup.plan_moves` whether relocating the arrived job, or the members of the
group a job just left, saves enough to pay for the move; a moved job keeps its iterations and
pays the relocation downtime (checkpoint, restart, reload) before its next phase.

Learned phase times (`PolicyConfig.learn`, RollMux only): every finished iteration's realised
phase times go to a `PhaseLearner`; when a member has `learn_min_samples` of them (a learning event
ends its segment then) the group plans it with the learned profile, and a member the learned
times show to be over its SLO is relocated (`regroup.plan_rescue`), once.

Events at the same instant: departures first, so a job that finishes as another arrives frees
its share of the group before the policy looks at it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollmux.coordinator.policy.admission import place_pending
from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.policy.executor import run_schedule
from rollmux.coordinator.policy.intra_group import (
    MemberTiming,
    PhaseInterval,
    PhaseTimeFn,
    ReleaseFn,
)
from rollmux.coordinator.policy.learning import PhaseLearner
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.regroup import Move, apply_moves, move_cap, plan_moves, plan_rescue, slo_risks
from rollmux.coordinator.policy.state import ClusterState, GroupState
from rollmux.coordinator.sim.api import (
    JobOutcome,
    PolicyRun,
    ProgressFn,
    SimContext,
    TimelinePoint,
    TraceJob,
)
from rollmux.coordinator.sim.runtime import JobDraws
from rollmux.core.model import JobSpec, Phase, Pool

_DEPARTURE, _ARRIVAL, _LEARN = 0, 1, 2  # heap order at equal times


@dataclass(slots=True)
class _Progress:
    """Work one job has done: whole iterations, and seconds into the current one's phases."""

    done_iters: int = 0
    roll_done_s: float = 0.0  # negative while a relocation's downtime is still to be paid
    train_done_s: float = 0.0


@dataclass(slots=True)
class _Segment:
    """A stretch of constant membership of one group, simulated from `start_s`."""

    start_s: float
    members: list[str]
    colocated_jobs: frozenset[str]  # members whose Rollout runs on their training nodes
    train_pool: Pool  # where the group's training nodes are (co-located Rollouts run there too)
    by_job: dict[str, list[PhaseInterval]] = field(default_factory=dict)  # job -> [roll0, train0, roll1, ...]


class _Replay:
    """Mutable record of one policy's replay; `run()` drives it to the end of the trace."""

    def __init__(self, name: str, policy: PlacementPolicy, trace: Sequence[TraceJob], specs: dict[str, JobSpec],
                 ctx: SimContext, progress: ProgressFn | None) -> None:
        self.name, self.policy, self.ctx, self.progress = name, policy, ctx, progress
        self.trace = {j.job_id: j for j in trace}
        self.specs = specs
        self.state = ClusterState(ctx.cluster)
        self.jobs = {j.job_id: _Progress() for j in trace}
        self.segments: dict[str, _Segment] = {}
        self.version: dict[str, int] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = itertools.count()
        self.timeline: list[TimelinePoint] = []
        self.outcomes: dict[str, JobOutcome] = {}
        self.busy = {Pool.ROLLOUT.value: 0.0, Pool.TRAIN.value: 0.0}
        self.intervals: dict[str, list[PhaseInterval]] = {}
        self.relocations = 0
        config = policy.config if isinstance(policy, RollMuxPolicy) else None
        self.learner = PhaseLearner(config) if config is not None and config.learn else None
        if self.learner is not None:
            policy.learner = self.learner  # type: ignore[attr-defined]
        self.moved: dict[str, int] = {}  # job -> relocations so far
        # Learning events end a segment when a member's times become learned: look for moves then too.
        self._regroup_on_learn = config is not None and config.regroup_on_learn
        self._max_moves = config.max_moves_per_job if config is not None else 0  # relocations one job may take
        for j in trace:
            heapq.heappush(self.events, (j.arrival_s, _ARRIVAL, next(self.seq), j.job_id, 0))
        self._arriving: dict[float, list[str]] = {}  # arrival time -> jobs arriving then (pending together)
        for j in trace:
            self._arriving.setdefault(j.arrival_s, []).append(j.job_id)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> PolicyRun:
        started = time.perf_counter()
        while self.events:
            t, kind, _, key, version = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self._arrive_and_regroup(key, t)
            elif self.version.get(key) == version:
                self._settle(key, t)
                if key in self.state.groups:
                    self._start_segment(key, t)
                    self._rescue(key, t)
                    if key in self.state.groups and (kind == _DEPARTURE or self._regroup_on_learn):
                        self._regroup(list(self.state.groups[key].members), t)
            else:
                continue  # a stale departure: the group changed since it was predicted
            self.timeline.append(TimelinePoint(
                t_s=t, usd_per_h=self.state.usd_per_h,
                rollout_gpus=self.state.gpus_in_use(Pool.ROLLOUT), train_gpus=self.state.gpus_in_use(Pool.TRAIN)))
            if self.progress is not None and kind == _ARRIVAL:
                self.progress(1)
        missing = set(self.trace) - set(self.outcomes)
        assert not missing, f"jobs never finished: {sorted(missing)[:5]}"
        return PolicyRun(policy=self.name, timeline=tuple(self.timeline),
                         jobs=tuple(self.outcomes[j] for j in self.trace), busy_gpu_s=dict(self.busy),
                         intervals={g: tuple(v) for g, v in self.intervals.items()},
                         wall_s=time.perf_counter() - started, relocations=self.relocations)

    def _arrive(self, job_id: str, t: float) -> None:
        spec = self.specs[job_id]
        # Jobs arriving at the same instant are pending together, as in the live admission.
        together = [self.specs[j] for j in self._arriving[self.trace[job_id].arrival_s]
                    if j != job_id and j not in self.state.job_group and j not in self.outcomes]
        decision = place_pending(self.policy, spec, self.state, together)
        if decision.group_id is not None:
            self._settle(decision.group_id, t)
        group = self.state.apply(spec, decision)
        if self.learner is not None:
            self.learner.register(spec)
            group.set_profile(job_id, self.policy.initial_profile(spec))  # type: ignore[attr-defined]
        self._start_segment(group.group_id, t)

    def _arrive_and_regroup(self, job_id: str, t: float) -> None:
        """An arrival and its regroup plan in one pass over the fleet (`regroup.place_arrival`'s memo):
        the plan's single move reads the placement's evaluations of every other group back."""
        policy = self.policy
        if not isinstance(policy, RollMuxPolicy) or not policy.config.regroup:
            self._arrive(job_id, t)
            return
        with policy.memoized():
            self._arrive(job_id, t)
            policy.forget(self.state.groups[self.state.job_group[job_id]])  # joined, its profile set: changed
            moves = plan_moves(self.state, policy, [job_id], self._remaining_s, pull=False)
        self._relocate(moves, t)

    def _remaining_s(self, job_id: str) -> float:
        """Solo seconds of work left (0 once a job took its `regroup.move_cap` relocations: it stays put)."""
        job = self.trace[job_id]
        if self.moved.get(job_id, 0) >= self._move_cap(job_id):
            return 0.0
        return (job.iterations - self.jobs[job_id].done_iters) * (job.t_roll_s + job.t_train_s)

    def _move_cap(self, job_id: str) -> int:
        config = self.policy.config if isinstance(self.policy, RollMuxPolicy) else None
        return 0 if config is None else move_cap(self.state, config, job_id)

    def _regroup(self, names: list[str], t: float, pull: bool = True) -> None:
        """Relocate jobs where the policy finds it worth the move (RollMux with regrouping on); `pull`:
        lone jobs may be pulled into the names' groups (not after an arrival: `regroup.plan_moves`)."""
        if not isinstance(self.policy, RollMuxPolicy) or not self.policy.config.regroup:
            return
        self._relocate(plan_moves(self.state, self.policy, names, self._remaining_s, pull=pull), t)

    def _rescue(self, gid: str, t: float) -> None:
        """Move out a member whose learned times put it over its SLO (each job once)."""
        if self.learner is None or not isinstance(self.policy, RollMuxPolicy) or not self.policy.config.regroup:
            return
        for name in slo_risks(self.state.groups[gid], self.policy.config):
            if self.moved.get(name, 0) < self._max_moves and self.state.groups[gid].members[name].profile.learned:
                self._relocate(plan_rescue(self.state, self.policy, name, self._remaining_s(name)), t)
                return

    def _relocate(self, moves: list[Move], t: float) -> None:
        if not moves:
            return
        touched = {m.from_group for m in moves} | {m.decision.group_id for m in moves if m.decision.group_id in self.state.groups}
        finished = len(self.outcomes)
        for gid in touched:
            self._settle(gid, t)  # credit work up to now; a job ending exactly now leaves first
        if len(self.outcomes) != finished:  # someone left while settling: the plan is stale
            for gid in touched & set(self.state.groups):
                self._start_segment(gid, t)
            return
        apply_moves(self.state, moves)
        for m in moves:
            self.jobs[m.job].roll_done_s -= m.downtime_s  # paid before its next Rollout
            self.moved[m.job] = self.moved.get(m.job, 0) + 1
            touched.add(self.state.job_group[m.job])
        self.relocations += len(moves)
        for gid in touched & set(self.state.groups):
            self._start_segment(gid, t)

    # -- segments ----------------------------------------------------------------------------------
    def _start_segment(self, gid: str, t: float) -> None:
        group = self.state.groups[gid]
        members = list(group.members)
        learning = []  # members still short of a confident profile
        if self.learner is not None:
            for j in members:
                profile = self.learner.profile(self.specs[j])
                if profile is not None and profile != group.members[j].profile:
                    group.set_profile(j, profile)
                if profile is None:
                    learning.append(self.policy.config.learn_min_samples - self.learner.samples(j))  # type: ignore[attr-defined]
                else:
                    learning.append(0)
        needed = [self.trace[j].iterations - self.jobs[j].done_iters for j in members]
        n_iter = min(needed)
        timings = [MemberTiming(name=j, t_roll_s=0.0, t_train_s=0.0, rollout_nodes=group.members[j].rollout_nodes,
                                rollout_on_train=group.members[j].colocated, train_nodes=group.members[j].train_nodes)
                   for j in members]
        phase_time, release = self._phase_time_fn(group, members)
        result = run_schedule(timings, iterations=n_iter, phase_time=phase_time, record=True,
                              rollout_release=release)
        seg = _Segment(start_s=t, members=members, train_pool=group.train_pool,
                       colocated_jobs=frozenset(j for j in members if group.members[j].colocated),
                       by_job={j: [] for j in members})
        for iv in result.intervals:
            seg.by_job[iv.job].append(PhaseInterval(
                job=iv.job, phase=iv.phase, iteration=iv.iteration, start_s=iv.start_s + t, end_s=iv.end_s + t,
                nodes=iv.nodes, released_s=None if iv.released_s is None else iv.released_s + t))
        self.segments[gid] = seg
        finish = min(seg.by_job[j][2 * n_iter - 1].end_s for j, k in zip(members, needed) if k == n_iter)
        self.version[gid] = self.version.get(gid, 0) + 1
        heapq.heappush(self.events, (finish, _DEPARTURE, next(self.seq), gid, self.version[gid]))
        learned_at = [seg.by_job[j][2 * k - 1].end_s for j, k in zip(members, learning) if 0 < k <= n_iter]
        if learned_at and min(learned_at) < finish:
            heapq.heappush(self.events, (min(learned_at), _LEARN, next(self.seq), gid, self.version[gid]))

    def _phase_time_fn(self, group: GroupState, members: list[str]) -> tuple[PhaseTimeFn, ReleaseFn | None]:
        """Per-iteration phase durations of the members, and when each rollout hands its nodes on."""
        cfg = self.ctx.runtime
        multi = len(members) > 1
        ms = [group.members[j] for j in members]
        # Context switches happen only on nodes another member also uses; a co-located member
        # swaps its rollout and training state on its GPUs before every phase.
        shares = [m.colocated or any(len(group.rollout[n].jobs) > 1 for n in m.rollout_nodes) for m in ms]
        draws: list[JobDraws] = [self.ctx.draws[j] for j in members]
        base = [self.jobs[j].done_iters for j in members]
        # A member trains on its own GPUs (on the whole training pool only when elastic), at the
        # pool's speed; a co-located Rollout runs at the speed of the group's GPUs.
        stretch = [m.train_factor for m in ms]
        roll_x = [m.roll_factor for m in ms]
        # A co-located member's weights stay on its GPUs: no sync over the inter-cluster link.
        colocated = [m.colocated for m in ms]
        roll_done = [self.jobs[j].roll_done_s for j in members]
        train_done = [self.jobs[j].train_done_s for j in members]
        if cfg.warm_start:
            sw_roll = [d.warm_roll_s if s else 0.0 for d, s in zip(draws, shares)]
            sw_train = [d.warm_train_s if multi or m.colocated else 0.0 for d, m in zip(draws, ms)]
        else:
            sw_roll = [d.cold_roll_s if s else 0.0 for d, s in zip(draws, shares)]
            sw_train = [d.cold_train_s if multi or m.colocated else 0.0 for d, m in zip(draws, ms)]

        def phase_time(idx: int, it: int, phase: Phase) -> float:
            d = draws[idx]
            g = base[idx] + it
            if phase is Phase.ROLLOUT:
                value = float(d.roll_s[g]) * roll_x[idx] + sw_roll[idx]
                return max(0.0, value - roll_done[idx]) if it == 0 else value
            if colocated[idx]:
                value = max(0.0, float(d.train_s[g]) - d.two_stage_sync_s) * stretch[idx] + sw_train[idx]
            else:
                value = float(d.train_s[g]) * stretch[idx] + d.flat_sync_extra_s + sw_train[idx]
            return max(0.0, value - train_done[idx]) if it == 0 else value

        rule = cfg.migration_rule
        gpus = [self.specs[j].n_rollout_gpus for j in members]

        def release(idx: int, it: int) -> float:
            # Long-tail migration: the nodes pass on once the rollout is tail-bound (runtime.py).
            value = sw_roll[idx] + draws[idx].release_s(base[idx] + it, rule, gpus[idx])
            return max(0.0, value - roll_done[idx]) if it == 0 else value

        return phase_time, (release if cfg.migration and any(shares) else None)

    def _settle(self, gid: str, t: float) -> None:
        """End the group's segment at `t`: credit work done, account busy time, retire finished jobs."""
        seg = self.segments.pop(gid, None)
        if seg is None:
            return
        gpn = self.state.cluster.gpus_per_node
        keep = self.ctx.record_intervals
        for j, ivs in seg.by_job.items():
            prog = self.jobs[j]
            completed = 0
            for k in range(0, len(ivs), 2):
                roll, train = ivs[k], ivs[k + 1]
                for iv in (roll, train):
                    overlap = min(iv.end_s, t) - iv.start_s
                    if overlap > 0:
                        self._account_busy(iv, t, seg, gpn)
                        if keep:
                            self.intervals.setdefault(gid, []).append(iv if iv.end_s <= t else PhaseInterval(
                                job=iv.job, phase=iv.phase, iteration=iv.iteration, start_s=iv.start_s, end_s=t,
                                nodes=iv.nodes, released_s=None if iv.released_s is None else min(iv.released_s, t)))
                if train.end_s <= t:
                    completed += 1
                    if self.learner is not None:
                        d = self.ctx.draws[j]
                        it = prog.done_iters + completed - 1
                        self.learner.observe(j, float(d.roll_s[it]), float(d.train_s[it]) + d.flat_sync_extra_s)
                    continue
                roll_elapsed = max(0.0, min(roll.end_s, t) - roll.start_s)
                train_elapsed = max(0.0, min(train.end_s, t) - train.start_s)
                first = k == 0
                prog.roll_done_s = (prog.roll_done_s if first else 0.0) + roll_elapsed
                prog.train_done_s = (prog.train_done_s if first else 0.0) + train_elapsed
                break
            else:
                prog.roll_done_s = prog.train_done_s = 0.0
            prog.done_iters += completed
            if prog.done_iters >= self.trace[j].iterations:
                self._finish(j, gid, t)

    def _account_busy(self, iv: PhaseInterval, t: float, seg: _Segment, gpn: int) -> None:
        """GPU-seconds the phase ran before `t`; a migrated tail only keeps its rule's share of its GPUs."""
        if iv.phase is Phase.TRAIN or iv.job in seg.colocated_jobs:  # a Train, or a co-located Rollout: its training nodes
            self.busy[seg.train_pool.value] += (min(iv.end_s, t) - iv.start_s) * len(iv.nodes) * gpn
            return
        gpus = len(iv.nodes) * gpn
        head_end = min(iv.end_s if iv.released_s is None else iv.released_s, t)
        tail = max(0.0, min(iv.end_s, t) - head_end)
        share = self.ctx.runtime.migration_rule.kept_share(self.specs[iv.job].n_rollout_gpus)
        self.busy[Pool.ROLLOUT.value] += (head_end - iv.start_s) * gpus + tail * gpus * share

    def _finish(self, job_id: str, gid: str, t: float) -> None:
        job = self.trace[job_id]
        self.outcomes[job_id] = JobOutcome(
            job_id=job_id, arrival_s=job.arrival_s, finish_s=t, iterations=job.iterations,
            mean_iteration_s=(t - job.arrival_s) / job.iterations,
            solo_iteration_s=self.ctx.draws[job_id].solo_iteration_s, slo=job.slo,
            planned_solo_s=job.t_roll_s + job.t_train_s, group_id=gid)
        self.state.remove_job(job_id)
        if self.learner is not None:
            self.learner.forget(job_id)


class GroupStrategy:
    """A `SimStrategy` for any placement policy that packs jobs into co-execution groups."""

    def __init__(self, name: str, policy: PlacementPolicy) -> None:
        self.name = name
        self.policy = policy

    def simulate(self, trace: Sequence[TraceJob], specs: dict[str, JobSpec], ctx: SimContext,
                 progress: ProgressFn | None = None) -> PolicyRun:
        return _Replay(self.name, self.policy, trace, specs, ctx, progress).run()
