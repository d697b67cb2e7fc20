"""Learned phase times in the live service: released durations feed the policy's `PhaseLearner`.

Every release reports the phase's measured duration. The permit carries the iteration's rollout
and train seconds until its Sync is released; then the iteration, solo-normalised (the member's
hardware factors and warm loads taken out, as `policy.state.Member` puts them in), goes to the
learner, and the member is planned with its learned profile once the learner is confident
(`PolicyConfig.learn_min_samples`). Admission and SLO checks then use those times
(`policy.placement`), and newcomers are judged against the fleet prior. The iteration that makes
a member's times learned is a learning event: its group is queued for the paced planner
(`next_event`; at the front when a member is at SLO risk, else with `PolicyConfig.regroup_on_learn`),
which looks at the group's members for moves (`runtime.relocation`), as after a departure and as in
the simulator.

Durability: each job's window of measured iterations is stored (``learn/<job>``, written in the
same commit as the Sync release that added to it) and replayed into a fresh learner on reload, so a
restarted coordinator plans with the same profiles. The fleet prior's share of jobs that already
left is not stored: after a restart it is rebuilt from the jobs still running.

Owns: `learner`, `learned` (``learn/<job>``), the queued learning events (`rescue_due`, `replan`)
and the members' profiles in the placement. Calls nothing but the policy.
"""

from __future__ import annotations

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.learning import PhaseLearner
from rollmux.coordinator.policy.modes import sync_s
from rollmux.coordinator.policy.regroup import slo_risks
from rollmux.coordinator.service.runtime.records import PermitRecord, dumps
from rollmux.coordinator.service.runtime.state import RuntimeState
from rollmux.core.model import Phase


class PhaseLearning:
    """Feeding measured iterations to the learner and planning members with what it learned."""

    def __init__(self, state: RuntimeState) -> None:
        self.state = state
        self.learner: PhaseLearner | None = None  # measured iterations per job
        self.learned: dict[str, list[tuple[float, float]]] = {}  # job -> its stored window (learn/<job>)
        # groups whose learning events wait for the paced planner, oldest first; memory only
        self.rescue_due: dict[str, None] = {}  # with a member at SLO risk: looked at first
        self.replan: dict[str, None] = {}
        policy = state.policy
        if isinstance(policy, RollMuxPolicy) and policy.config.learn:
            self.learner = PhaseLearner(policy.config)
            policy.learner = self.learner  # newcomers get the fleet prior, members their learned times

    def measured(self, name: str, permit: PermitRecord, duration_s: float) -> tuple[float, float]:
        """This iteration's (rollout, train) seconds after releasing `permit`; a Sync ends the iteration."""
        roll, train = permit.iter_roll_s, permit.iter_train_s
        if permit.phase is Phase.ROLLOUT:
            return duration_s, 0.0
        if permit.phase is Phase.TRAIN:
            return roll, duration_s
        self._observe(name, roll, train + duration_s)
        return 0.0, 0.0

    def _observe(self, name: str, roll_s: float, train_s: float) -> None:
        """One finished iteration, as measured in its group, to the learner (solo-normalised)."""
        state = self.state
        job = state.jobs.get(name)
        group = state.placement.groups.get(job.group_id) if job is not None else None
        if self.learner is None or group is None or name not in group.members:
            return
        m = group.members[name]
        solo_roll = round(max(0.0, roll_s - m.switch_roll_s) / m.roll_factor, 6)  # as stored: a reload learns the same
        solo_train = round(max(0.0, train_s - m.switch_train_s) / m.train_factor
                           + (sync_s(m.spec) if m.colocated else 0.0), 6)
        self.learner.observe(name, solo_roll, solo_train)
        state.capacity_changed()  # the fleet prior pending jobs are judged with (`learner.prior`) may move
        window = self.learned.setdefault(name, [])
        window.append((solo_roll, solo_train))
        del window[:-self.learner.config.learn_window]
        state.put(f"learn/{name}", lambda w=list(window): dumps(w))
        was_learned = m.profile.learned
        self.joined(name)
        if not was_learned and group.members[name].profile.learned:
            self._became_learned(group.group_id)  # its group's plan changed: look for moves, as the simulator does

    def _became_learned(self, group_id: str) -> None:
        """Queue the group for the paced planner (`next_event`): a rescue search, or a search for a
        move that saves $, walks every group of the cluster (~10 ms at 2,000 groups), too long for the
        transition that releases a Sync. A group with a member at SLO risk (group-local check) goes
        to the front."""
        policy = self.state.policy
        group = self.state.placement.groups.get(group_id)
        if (group is not None and isinstance(policy, RollMuxPolicy)
                and any(group.members[n].profile.learned for n in slo_risks(group, policy.config))):
            self.rescue_due[group_id] = None
        elif isinstance(policy, RollMuxPolicy) and policy.config.regroup_on_learn:
            self.replan[group_id] = None

    def next_event(self) -> str | None:
        """Take the oldest queued group that still exists (at-risk ones first); None when none is left."""
        for queue in (self.rescue_due, self.replan):
            while queue:
                group_id = next(iter(queue))
                del queue[group_id]
                if group_id in self.state.placement.groups:
                    return group_id
        return None

    def joined(self, name: str) -> None:
        """Member `name` joined a group (admission, restore, relocation) or was measured: plan it with
        what is learned of it."""
        state = self.state
        job = state.jobs.get(name)
        group = state.placement.groups.get(job.group_id) if job is not None else None
        if self.learner is None or job is None or group is None or name not in group.members:
            return
        self.learner.register(job.spec)
        profile = self.learner.profile(job.spec) or state.policy.initial_profile(job.spec)  # type: ignore[attr-defined]
        if profile != group.members[name].profile:
            group.set_profile(name, profile)
            state.placement._reindex(group)  # noqa: SLF001  (saturation may change with the profile)
            state.capacity_changed()

    def forget(self, name: str) -> None:
        """A job left: drop what was learned of it."""
        if self.learner is not None:
            self.learner.forget(name)
        if self.learned.pop(name, None) is not None:
            self.state.forget(f"learn/{name}")

    def restore(self, name: str, window: list[list[float]] | None) -> None:
        """Replay a job's stored window of measured iterations (coordinator restart), then plan it."""
        if window is not None and self.learner is not None and name in self.state.jobs:
            self.learned[name] = [(float(r), float(t)) for r, t in window]
            for r, t in self.learned[name]:
                self.learner.observe(name, r, t)
        self.joined(name)
