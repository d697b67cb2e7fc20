"""Learned phase times in the live service: released durations feed the policy's `PhaseLearner`.

Every release reports the phase's measured duration. The permit carries the iteration's rollout
and train seconds until its Sync is released; then the iteration, solo-normalised (the member's
hardware factors and warm loads taken out, as `policy.state.Member` puts them in), goes to the
learner, and the member is planned with its learned profile once the learner is confident
(`PolicyConfig.learn_min_samples`). Admission and SLO checks then use those times
(`policy.placement`), and newcomers are judged against the fleet prior. The iteration that makes
a member's times learned is a learning event: with `PolicyConfig.regroup_on_learn` the group's
members are looked at for moves (`runtime.relocation`), as after a departure and as in the simulator.

Durability: each job's window of measured iterations is stored (``learn/<job>``, written in the
same commit as the Sync release that added to it) and replayed into a fresh learner on reload, so a
restarted coordinator plans with the same profiles. The fleet prior's share of jobs that already
left is not stored: after a restart it is rebuilt from the jobs still running.
"""

from __future__ import annotations

from rollmux.coordinator.policy.modes import sync_s
from rollmux.coordinator.service.records import PermitRecord, dumps
from rollmux.coordinator.service.runtime.nodes import NodeLiveness
from rollmux.model import Phase


class PhaseLearning(NodeLiveness):
    """Feeding measured iterations to the learner and planning members with what it learned."""

    def _measured(self, name: str, permit: PermitRecord, duration_s: float) -> tuple[float, float]:
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
        job = self.jobs.get(name)
        group = self.placement.groups.get(job.group_id) if job is not None else None
        if self.learner is None or group is None or name not in group.members:
            return
        m = group.members[name]
        solo_roll = round(max(0.0, roll_s - m.switch_roll_s) / m.roll_factor, 6)  # as stored: a reload learns the same
        solo_train = round(max(0.0, train_s - m.switch_train_s) / m.train_factor
                           + (sync_s(m.spec) if m.colocated else 0.0), 6)
        self.learner.observe(name, solo_roll, solo_train)
        window = self.learned.setdefault(name, [])
        window.append((solo_roll, solo_train))
        del window[:-self.learner.config.learn_window]
        self._dirty[f"learn/{name}"] = lambda w=list(window): dumps(w)
        was_learned = m.profile.learned
        self._joined(name)
        if not was_learned and group.members[name].profile.learned:
            self._became_learned(name, group.group_id)  # its group's plan changed: look for moves, as the simulator does

    def _joined(self, name: str) -> None:
        job = self.jobs.get(name)
        group = self.placement.groups.get(job.group_id) if job is not None else None
        if self.learner is None or job is None or group is None or name not in group.members:
            return
        self.learner.register(job.spec)
        profile = self.learner.profile(job.spec) or self.policy.initial_profile(job.spec)  # type: ignore[attr-defined]
        if profile != group.members[name].profile:
            group.set_profile(name, profile)
            self.placement._reindex(group)  # noqa: SLF001  (saturation may change with the profile)

    def _forget_learned(self, name: str) -> None:
        if self.learner is not None:
            self.learner.forget(name)
        if self.learned.pop(name, None) is not None:
            self._dirty[f"learn/{name}"] = lambda: None

    def restore_learned(self, name: str, window: list[list[float]]) -> None:
        """Replay a stored window of measured iterations (coordinator restart)."""
        if self.learner is None or name not in self.jobs:
            return
        self.learned[name] = [(float(r), float(t)) for r, t in window]
        for r, t in self.learned[name]:
            self.learner.observe(name, r, t)
        self._joined(name)
