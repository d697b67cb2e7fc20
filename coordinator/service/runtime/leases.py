"""Permits and their leases: acquire, renew, release (with phase-time estimates), expiry."""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.coordinator.service.api import (
    FailedPreconditionError,
    NodeState,
    OutOfOrderError,
    PermitState,
    StaleEpochError,
)
from rollmux.coordinator.service.records import PermitRecord
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import NODE_TRANSITIONS, PERMIT_PARKED, PERMIT_TRANSITIONS, transition
from rollmux.model import Phase, next_phase


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseResult:
    next_phase: Phase
    next_iteration: int
    already_released: bool  # a retried release of the same epoch


class Leases(PhaseLearning):
    """A job's permit through its phases: asked for, granted (leased), renewed, released, expired."""

    def acquire(self, name: str, phase: Phase, iteration: int) -> PermitRecord | None:
        """Ask for `phase` of `iteration`; returns the permit (GRANTED or QUEUED), or None while the
        job is pending admission. A GRANTED permit is renewed; a parked one is queued at the tail.

        Raises:
            NotFoundError: unknown job.
            OutOfOrderError: the phase is not the job's next one in on-policy order.
        """
        job = self.job(name)
        permit = self.permits.get(name)
        expected = (permit.phase, permit.iteration) if permit else (Phase.ROLLOUT, 0)
        if (phase, iteration) != expected:
            raise OutOfOrderError(
                f"job {name!r} asked for {phase.value}({iteration}) out of order: its next phase is "
                f"{expected[0].value}({expected[1]}) (Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1))")
        if permit is None:
            return None
        if permit.state is PermitState.GRANTED:
            permit.expires_at = self.clock() + self.config.lease_ttl_s
            permit.picked = True  # the job holds this grant now (a relocation may no longer take it back)
        elif permit.state in PERMIT_PARKED:
            transition(permit, PERMIT_TRANSITIONS, PermitState.QUEUED, now=self.wall(), reason="asked again")
            self._touch(f"permit/{name}", permit)
            self._enqueue(permit)
            self._pump(self.phase_nodes(job, phase))
        return permit

    def _granted(self, name: str, epoch: int, what: str) -> PermitRecord:
        self.job(name)
        permit = self.permits.get(name)
        if permit is None:
            raise FailedPreconditionError(f"job {name!r} holds no permit to {what}: it is pending admission")
        if permit.state is not PermitState.GRANTED or permit.epoch != epoch:
            current = (f"its current permit is {permit.phase.value}({permit.iteration}) "
                       f"{permit.state.value} with epoch {permit.epoch}")
            raise StaleEpochError(f"cannot {what} job {name!r} epoch {epoch}: the epoch is stale, {current}; "
                                  "stop the phase and acquire the permit again")
        return permit

    def renew(self, name: str, epoch: int) -> float:
        permit = self._granted(name, epoch, "renew")
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        return self.config.lease_ttl_s

    def release(self, name: str, epoch: int, duration_s: float) -> ReleaseResult:
        """End a phase: free its nodes, record its duration, queue the job's next phase.

        Raises:
            StaleEpochError: `epoch` does not hold the job's lease (and is not the last released one).
        """
        permit = self.permits.get(name)
        if permit is not None and epoch and epoch == permit.last_released_epoch:
            return ReleaseResult(next_phase=permit.phase, next_iteration=permit.iteration, already_released=True)
        permit = self._granted(name, epoch, "release")
        job = self.jobs[name]
        transition(permit, PERMIT_TRANSITIONS, PermitState.RELEASED, now=self.wall(), reason="released")
        freed = permit.nodes
        for n in freed:
            self._free_node(n, announce=False)
        phase, it = next_phase(permit.phase, permit.iteration)
        a = self.config.estimate_alpha
        roll, train = permit.observed_roll_s, permit.observed_train_s
        if permit.phase is Phase.ROLLOUT:
            roll = duration_s if not roll else a * duration_s + (1 - a) * roll
        elif permit.phase is Phase.TRAIN:
            train = duration_s if not train else a * duration_s + (1 - a) * train
        else:  # sync is part of T_train in the policy: add it to the last train sample
            train += a * duration_s
        iter_roll, iter_train = self._measured(name, permit, duration_s)
        nxt = PermitRecord(job=name, phase=phase, iteration=it, epoch=epoch, last_released_epoch=epoch,
                           observed_roll_s=roll, observed_train_s=train, iter_roll_s=iter_roll, iter_train_s=iter_train)
        self.permits[name] = nxt
        self._touch(f"permit/{name}", nxt)
        self._enqueue(nxt)
        self._pump(list(freed) + list(self.phase_nodes(job, phase)))
        return ReleaseResult(next_phase=phase, next_iteration=it, already_released=False)

    def advance(self, name: str, epoch: int, duration_s: float) -> tuple[ReleaseResult, PermitRecord]:
        """Release the phase held with `epoch` and ask for the next one, as one transition.

        Returns:
            The release result and the next phase's permit (GRANTED when its nodes were free).

        Raises:
            StaleEpochError: as `release`; nothing changed.
        """
        res = self.release(name, epoch, duration_s)
        permit = self.acquire(name, res.next_phase, res.next_iteration)
        assert permit is not None  # an admitted job (it held a lease) always has a permit
        return res, permit


    def expire(self) -> list[str]:
        """Turn silent nodes LOST and revoke every lease past its TTL; returns the jobs whose lease expired.

        A node whose stream is open but whose heartbeats lapsed (`ServiceConfig.heartbeat_lapse_s`)
        turns LOST: nothing new is granted on it; its running lease, no longer renewed, expires here
        after its TTL like any other.
        """
        now = self.clock()
        for node in self._lapsed_nodes(now):
            transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.wall(),
                       reason=f"no heartbeat for {self.config.heartbeat_lapse_s:g}s (stream still open)")
            self._touch(f"node/{node.node_id}", node)
            self._notify(Notice(kind=NoticeKind.NODE, nodes=(node.node_id,)))
        expired = [p for p in self.permits.values() if p.state is PermitState.GRANTED and p.expires_at <= now]
        freed: list[str] = []
        for permit in expired:
            transition(permit, PERMIT_TRANSITIONS, PermitState.EXPIRED, now=self.wall(),
                       reason=f"TTL {self.config.lease_ttl_s}s lapsed")
            for n in permit.nodes:
                self._free_node(n)
            freed.extend(permit.nodes)
            self._notify(Notice(kind=NoticeKind.REVOKED, job=permit.job, nodes=permit.nodes, epoch=permit.epoch,
                                reason="lease expired"))
            self._notify(Notice(kind=NoticeKind.JOB, job=permit.job))
            permit.nodes = ()
            self._touch(f"permit/{permit.job}", permit)
        self._pump(freed)
        return [p.job for p in expired]

    def next_expiry(self) -> float | None:
        deadlines = [p.expires_at for p in self.permits.values() if p.state is PermitState.GRANTED]
        return min(deadlines, default=None)

    def next_deadline(self) -> float | None:
        """The earliest lease expiry or heartbeat lapse (when `expire` would change something)."""
        lapse = self.config.heartbeat_lapse_s
        silent = [node.heard_at + lapse for n in self.connected if (node := self.nodes.get(n)) is not None
                  and node.state is NodeState.READY]
        leases = self.next_expiry()
        return min([*silent, *([] if leases is None else [leases])], default=None)

    @property
    def deadline_horizon_s(self) -> float:
        """Every deadline set from now on lies at least this far ahead (TTLs and lapses are constant)."""
        return min(self.config.lease_ttl_s, self.config.heartbeat_lapse_s)

