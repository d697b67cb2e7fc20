"""Switching a multi-move plan in one epoch: every moved job acknowledges, or nothing changes.

A `replan.Plan` pays only as a whole, so carrying out some of its moves can leave the cluster
costlier than before. `PlanSwitch` is the state machine of one plan's switch, the same for the
simulator (whose jobs acknowledge at their next iteration boundary) and for any live executor:

    PENDING --every moved job acknowledged, the plan still applies--> COMMITTED
    PENDING --a job declined / the deadline passed / the plan no longer applies--> ROLLED_BACK

Nothing touches the cluster state before the commit, and the commit applies the whole plan on a
scratch copy first (`replan.apply_plan`), so a rollback leaves every job where it was. Pure: the
caller passes the clock and the cluster state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from rollmux.coordinator.policy.api import PolicyError
from rollmux.coordinator.policy.replan import Plan, apply_plan
from rollmux.coordinator.policy.state import ClusterState
from rollmux.core.errors import ErrorCode
from rollmux.core.model import Pool


class SwitchPhase(str, Enum):
    PENDING = "pending"  # waiting for the moved jobs' acknowledgements
    COMMITTED = "committed"  # every move applied, in one step
    ROLLED_BACK = "rolled-back"  # nothing applied; every job stays where it was


class RollbackReason(str, Enum):
    DECLINED = "declined"  # a moved job refused (it cannot stop at a boundary now, it is leaving)
    DEADLINE = "deadline"  # not every moved job acknowledged in time
    STALE = "stale"  # the cluster changed meanwhile: the plan no longer applies whole


class SwitchError(PolicyError):
    """An acknowledgement that does not belong to this switch (another epoch, a job it does not move)."""

    code = ErrorCode.FAILED_PRECONDITION


@dataclass(slots=True, kw_only=True)
class PlanSwitch:
    plan: Plan
    epoch: int  # names the switch; a job acknowledges with it
    deadline_s: float  # acknowledgements after this roll the plan back
    phase: SwitchPhase = SwitchPhase.PENDING
    acked: set[str] = field(default_factory=set)
    reason: RollbackReason | None = None
    detail: str = ""  # what an operator reads: who declined, what no longer applies

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return tuple(j for j in self.plan.jobs if j not in self.acked)

    def _check(self, job: str, epoch: int) -> None:
        if epoch != self.epoch:
            raise SwitchError(f"acknowledgement of {job} names epoch {epoch}, the switch is epoch {self.epoch}")
        if job not in self.plan.jobs:
            raise SwitchError(f"{job} is not moved by the switch of epoch {self.epoch}")

    def ack(self, job: str, epoch: int, now_s: float) -> SwitchPhase:
        """`job` stopped at its iteration boundary and is ready to move; past the deadline this rolls back."""
        self._check(job, epoch)
        if self.phase is not SwitchPhase.PENDING:
            return self.phase
        if now_s > self.deadline_s:
            return self._roll_back(RollbackReason.DEADLINE, f"{job} acknowledged at {now_s:.0f} s, after the "
                                                            f"deadline {self.deadline_s:.0f} s")
        self.acked.add(job)
        return self.phase

    def decline(self, job: str, epoch: int, why: str = "") -> SwitchPhase:
        self._check(job, epoch)
        if self.phase is SwitchPhase.PENDING:
            self._roll_back(RollbackReason.DECLINED, f"{job} declined" + (f": {why}" if why else ""))
        return self.phase

    def expire(self, now_s: float) -> SwitchPhase:
        if self.phase is SwitchPhase.PENDING and now_s > self.deadline_s and self.waiting_for:
            self._roll_back(RollbackReason.DEADLINE, f"no acknowledgement from {','.join(self.waiting_for)} by "
                                                     f"{self.deadline_s:.0f} s")
        return self.phase

    @property
    def ready(self) -> bool:
        return self.phase is SwitchPhase.PENDING and not self.waiting_for

    def commit(self, state: ClusterState, allocate: Callable[[Pool, int], list[str]] | None = None) -> list[str]:
        """Apply the whole plan to `state` once every moved job acknowledged; returns the released node
        ids ([] and ROLLED_BACK, `state` untouched, when the plan no longer applies)."""
        if not self.ready:
            raise SwitchError(f"switch of epoch {self.epoch} is {self.phase.value}, waiting for "
                              f"{','.join(self.waiting_for) or 'nobody'}: nothing to commit")
        try:
            released = apply_plan(state, self.plan, allocate)
        except PolicyError as e:
            self._roll_back(RollbackReason.STALE, str(e))
            return []
        self.phase = SwitchPhase.COMMITTED
        return released

    def _roll_back(self, reason: RollbackReason, detail: str) -> SwitchPhase:
        self.phase, self.reason, self.detail = SwitchPhase.ROLLED_BACK, reason, detail
        return self.phase
