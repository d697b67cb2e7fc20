"""Permits and their leases: asked for, granted in queue order, renewed, released, expired.

A grant holds every needed node with a lease (cluster-wide increasing epoch + TTL); at most one
permit holds a node (`holder`). The order in which waiting phases are granted is the grant queues'
(`GrantQueues.step`, i.e. `policy.grants.grant_step`); this part applies it (`grant_waiting`).

Every way a lease lets go of nodes goes through `_free`. Release is per node (I2): a node's sidecar
releases once every local rank of the job released there and its GPU memory came down; that node
alone is freed and goes to the phases waiting for it, while the lease goes on holding the others
(`permit.nodes` shrinks, `permit.freed_nodes` records it). The permit ends (RELEASED, the job's next
phase queued) with its last node. A long-tail migration (`consolidate`) lets nodes go the same way.

The lease lapses per node too: each node's part runs a TTL from its own sidecar's last heartbeat
naming the epoch (`heartbeat`; the job's own renewal extends every node). A node whose sidecar
stopped renewing (a rank of the job died there) is freed alone when its part lapses, fenced by a
revocation to that node (`permit.lapsed_nodes`); the job's other nodes stay held until their own
sidecars release them. The phase did not complete, so the permit's last node ends it EXPIRED (the
job is parked and its phase granted again if it asks), never RELEASED.
An expiry, revocation or cancellation ends the lease on the nodes it still holds: a node released
early is never reclaimed by them.

Owns: the permit records (`state.permits`, ``permit/<job>``: every permit transition), `holder` and
`freed_at`. Calls NodeLiveness (a freed draining node is drained), GrantQueues (the grant step) and
PhaseLearning (a released phase's measured duration).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from rollmux.coordinator.service.runtime.api import (
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfOrderError,
    PermitState,
    StaleEpochError,
)
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.nodes import NodeLiveness
from rollmux.coordinator.service.runtime.records import JobRecord, PermitRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.runtime.states import PERMIT_PARKED, PERMIT_TRANSITIONS, transition
from rollmux.core.model import Phase, next_phase


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseResult:
    next_phase: Phase  # the job's phase after the released one (queued once every node released)
    next_iteration: int
    already_released: bool  # a retried release of the same epoch (or of the same node of it)
    held_nodes: tuple[str, ...] = ()  # nodes of the permit not released yet (empty: the permit is RELEASED)


class UnusedNode(str, Enum):
    """What the coordinator did with a node its sidecar reported granted to a job with no rank there."""

    RELEASED = "released"  # released on the job's behalf: its ranks attached elsewhere, not there
    KEPT_NO_ATTACH_YET = "kept-no-attach-yet"  # no rank of the job attached anywhere yet: one may still come
    TAKEN_BACK = "taken-back"  # no rank attached anywhere and the job never asked for the phase: revoked, its
    # phase waits for the job's ask (the node is not held while the job's processes start)
    KEPT_ATTACHED = "kept-attached"  # another sidecar of the job reported a rank there meanwhile
    KEPT_NOTHING_RAN = "kept-nothing-ran"  # the permit's last node and no node released it: the lease lapses
    STALE = "stale"  # the lease ended or no longer holds the node


class Leases:
    """A job's permit through its phases: asked for, granted (leased), renewed, released, expired."""

    def __init__(self, state: RuntimeState, liveness: NodeLiveness, queues: GrantQueues,
                 learning: PhaseLearning) -> None:
        self.state = state
        self.liveness = liveness
        self.queues = queues
        self.learning = learning
        self.holder: dict[str, str] = {}  # node -> job whose GRANTED permit holds it
        self.freed_at: dict[str, float] = {}  # node -> when its last permit ended (memory only)

    # ------------------------------------------------------------------------------------ asking
    def open(self, job: JobRecord) -> None:
        """An admitted job's first permit, Rollout(0), queued (stored even while queued: a reload
        must find it)."""
        permit = PermitRecord(job=job.name, phase=Phase.ROLLOUT, iteration=0)
        self.state.permits[job.name] = permit
        self.state.touch(f"permit/{job.name}", permit)
        self._enqueue(permit)

    def acquire(self, name: str, phase: Phase, iteration: int) -> PermitRecord | None:
        """Ask for `phase` of `iteration`; returns the permit (GRANTED or QUEUED), or None while the
        job is pending admission. A GRANTED permit is renewed; a parked one is queued at the tail.

        Raises:
            NotFoundError: unknown job.
            OutOfOrderError: the phase is not the job's next one in on-policy order.
        """
        state = self.state
        job = state.job(name)
        permit = state.permits.get(name)
        expected = (permit.phase, permit.iteration) if permit else (Phase.ROLLOUT, 0)
        if (phase, iteration) != expected:
            raise OutOfOrderError(
                f"job {name!r} asked for {phase.value}({iteration}) out of order: its next phase is "
                f"{expected[0].value}({expected[1]}) (Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1))")
        if permit is None:
            return None
        if permit.state is PermitState.GRANTED:
            self.extend(permit)
            permit.picked = True  # the job holds this grant now (a relocation may no longer take it back)
            permit.asked_at = permit.asked_at or state.clock()
        elif permit.state in PERMIT_PARKED:
            transition(permit, PERMIT_TRANSITIONS, PermitState.QUEUED, now=state.wall(), reason="asked again")
            state.touch(f"permit/{name}", permit)
            self._enqueue(permit)
            permit.asked_at = state.clock()
            self.grant_waiting(state.phase_nodes(job, phase))
        elif permit.state is PermitState.QUEUED and not permit.asked_at:
            permit.asked_at = state.clock()  # a request from now (memory only: nothing to store)
            self.grant_waiting(state.phase_nodes(job, phase))
        if permit.state is PermitState.GRANTED:
            permit.picked = True  # granted to this ask (here or earlier): the caller gets it
        return permit

    def _enqueue(self, permit: PermitRecord) -> None:
        """The permit waits from now (grant latency counts from when its nodes are free after this)."""
        permit.queued_at = self.state.clock()

    def requeue(self, permit: PermitRecord) -> None:
        """Store `permit` and let it wait from now (a relocated job's next phase, on its new nodes)."""
        self.state.touch(f"permit/{permit.job}", permit)
        self._enqueue(permit)
        permit.asked_at = 0.0  # granted once its job asks on the new nodes

    def parked(self) -> set[str]:
        """Jobs whose lease lapsed or was revoked: passed over until they ask again."""
        return {j for j, p in self.state.permits.items() if p.state in PERMIT_PARKED}

    # ---------------------------------------------------------------------------------- granting
    def grant_waiting(self, nodes: Iterable[str]) -> None:
        """Run the grant step in every group the touched nodes serve and lease what it grants."""
        state = self.state
        node_group = state.placement.node_group
        gids = dict.fromkeys(g for n in nodes if (g := node_group.get(n)) is not None)
        for gid in gids:
            for g in self.queues.step(gid, self.holder):
                self._grant(state.permits[g.job], state.jobs[g.job], g.nodes)

    def _grant(self, permit: PermitRecord, job: JobRecord, needed: tuple[str, ...]) -> None:
        state = self.state
        epoch = state.next_epoch()
        for m in needed:
            self.holder[m] = job.name
        transition(permit, PERMIT_TRANSITIONS, PermitState.GRANTED, now=state.wall(), reason=f"epoch {epoch}")
        permit.epoch, permit.nodes, permit.migrated, permit.picked = epoch, needed, False, False
        permit.freed_nodes, permit.node_release_s, permit.lapsed_nodes = (), 0.0, ()
        permit.expires_at = dict.fromkeys(needed, state.clock() + state.config.lease_ttl_s)
        permit.grantable_at = max([permit.queued_at, *(self.freed_at.get(m, 0.0) for m in needed)])
        state.touch(f"permit/{job.name}", permit)
        state.notify(Notice(kind=NoticeKind.GRANTED, job=job.name, nodes=needed, epoch=permit.epoch))

    def _free(self, node_id: str, *, announce: bool = True) -> None:
        """Free `node_id`; its sidecar hears a snapshot when `announce` or when the node changed state.

        A job's own release is not announced: the sidecar's ranks ended the phase themselves, and a
        snapshot per release was half of the coordinator's node-stream writes (docs/design/decisions.md).
        """
        self.holder.pop(node_id, None)
        self.freed_at[node_id] = self.state.clock()
        if self.liveness.permit_ended(node_id):
            announce = True
        if announce:
            self.state.notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))

    # ---------------------------------------------------------------------------------- holding
    def granted(self, name: str, epoch: int, what: str) -> PermitRecord:
        """The job's permit if `epoch` holds its lease.

        Raises:
            NotFoundError: unknown job.
            FailedPreconditionError: the job holds no permit (pending admission).
            StaleEpochError: `epoch` does not hold the job's lease.
        """
        self.state.job(name)
        permit = self.state.permits.get(name)
        if permit is None:
            raise FailedPreconditionError(f"job {name!r} holds no permit to {what}: it is pending admission")
        if permit.state is not PermitState.GRANTED or permit.epoch != epoch:
            current = (f"its current permit is {permit.phase.value}({permit.iteration}) "
                       f"{permit.state.value} with epoch {permit.epoch}")
            raise StaleEpochError(f"cannot {what} job {name!r} epoch {epoch}: the epoch is stale, {current}; "
                                  "stop the phase and acquire the permit again")
        return permit

    def extend(self, permit: PermitRecord) -> None:
        """The lease runs another TTL from now on every node it holds (the job itself renewed it)."""
        permit.expires_at = dict.fromkeys(permit.nodes, self.state.clock() + self.state.config.lease_ttl_s)

    def renew(self, name: str, epoch: int) -> float:
        self.extend(self.granted(name, epoch, "renew"))
        return self.state.config.lease_ttl_s

    def heartbeat(self, node_id: str, active_epochs: Iterable[int]) -> None:
        """A sidecar heartbeat renews the lease holding its node, on that node alone, if the node runs
        that epoch (a node whose sidecar stopped naming it lapses on its own, `expire`)."""
        job = self.holder.get(node_id)
        if job is not None:
            permit = self.state.permits[job]
            if permit.epoch in set(active_epochs) and node_id in permit.nodes:
                permit.expires_at[node_id] = self.state.clock() + self.state.config.lease_ttl_s

    def consolidate(self, permit: PermitRecord, *, keep: tuple[str, ...], release: tuple[str, ...]) -> None:
        """Long-tail migration: the lease keeps `keep` and frees `release` (once per lease: `migrated`)."""
        permit.nodes, permit.migrated = keep, True
        permit.freed_nodes = (*permit.freed_nodes, *release)
        for n in release:
            permit.expires_at.pop(n, None)
        self.state.touch(f"permit/{permit.job}", permit)
        for n in release:
            self._free(n)

    # ---------------------------------------------------------------------------------- ending
    def release(self, name: str, epoch: int, duration_s: float, *, node_id: str = "") -> ReleaseResult:
        """End a phase on `node_id` (per-node release, I2), or on every node when `node_id` is empty.

        A node's sidecar releases once every local rank of the job released there: that node alone is
        freed and handed to waiting phases. The permit turns RELEASED, its duration (the longest any
        node reported) is recorded and the job's next phase queued only when its last node released.
        A release without a node id (a client without a sidecar) ends the whole permit at once.

        Raises:
            StaleEpochError: `epoch` does not hold the job's lease (and is not the last released one).
            InvalidArgumentError: `node_id` is not one of the permit's nodes.
        """
        state = self.state
        permit = state.permits.get(name)
        if permit is not None and epoch and epoch == permit.last_released_epoch:
            return ReleaseResult(next_phase=permit.phase, next_iteration=permit.iteration, already_released=True)
        permit = self.granted(name, epoch, "release")
        upcoming = next_phase(permit.phase, permit.iteration)
        if node_id and node_id in permit.freed_nodes:  # a retry, or a node a migration let go already
            return ReleaseResult(next_phase=upcoming[0], next_iteration=upcoming[1], already_released=True,
                                 held_nodes=permit.nodes)
        if node_id and node_id not in permit.nodes:
            raise InvalidArgumentError(
                f"node {node_id} released job {name!r} epoch {epoch}, but that permit "
                f"({permit.phase.value}({permit.iteration})) holds node(s) {', '.join(permit.nodes)}: "
                "only a sidecar of one of its nodes releases it")
        if node_id and len(permit.nodes) > 1:
            self._release_node(permit, node_id, duration_s)
            return ReleaseResult(next_phase=upcoming[0], next_iteration=upcoming[1], already_released=False,
                                 held_nodes=permit.nodes)
        if permit.lapsed_nodes:  # the phase did not complete on a lapsed node: fenced, not advanced
            self._expire(permit, f"node(s) {', '.join(permit.lapsed_nodes)} lapsed; the others released")
            return ReleaseResult(next_phase=permit.phase, next_iteration=permit.iteration, already_released=False)
        return self._end(permit, max(duration_s, permit.node_release_s))

    def grant_without_rank(self, node_id: str, name: str, epoch: int) -> UnusedNode:
        """Node `node_id`'s sidecar got job `name`'s grant `epoch` with no rank of the job attached there.

        The node is released on the job's behalf when the job's ranks attached on other nodes (the job
        is not on this one), unless that would end a permit no node of which released: then nothing of
        the phase ran and the lease lapses at its TTL instead of skipping the phase.
        """
        state = self.state
        job, permit = state.jobs.get(name), state.permits.get(name)
        if (job is None or permit is None or permit.state is not PermitState.GRANTED or permit.epoch != epoch
                or node_id not in permit.nodes):
            return UnusedNode.STALE
        if not job.attach_nodes:
            # Granted before the job ever asked, on its one node: do not hold the node while the job starts.
            # (A multi-node permit stays: its ranks attach node by node, and a node released on the job's
            # behalf before its rank came could not be given back to the same phase.)
            if not permit.asked_at and len(permit.nodes) == 1 and not permit.freed_nodes:
                self._await_ask(permit)
                return UnusedNode.TAKEN_BACK
            return UnusedNode.KEPT_NO_ATTACH_YET
        if node_id in job.attach_nodes:
            return UnusedNode.KEPT_ATTACHED
        if len(permit.nodes) == 1 and not permit.freed_nodes:
            return UnusedNode.KEPT_NOTHING_RAN
        self.release(name, epoch, 0.0, node_id=node_id)
        return UnusedNode.RELEASED

    def _await_ask(self, permit: PermitRecord) -> None:
        """Revoke a grant no ask was answered with (fenced by its epoch) and queue its phase again,
        granted only once the job asks for it; the freed nodes go to the phases waiting for them."""
        freed = permit.nodes
        self.take_back(permit, "granted before the job asked, no rank attached", requeued="waits for its ask")
        permit.awaits_ask = True
        self.state.touch(f"permit/{permit.job}", permit)
        self.grant_waiting(freed)

    def _release_node(self, permit: PermitRecord, node_id: str, duration_s: float) -> None:
        """One node of a lease that goes on released: free it alone, hand it to the phases waiting for it."""
        permit.nodes = tuple(n for n in permit.nodes if n != node_id)
        permit.expires_at.pop(node_id, None)
        permit.freed_nodes = (*permit.freed_nodes, node_id)
        permit.node_release_s = max(permit.node_release_s, duration_s)
        self.state.touch(f"permit/{permit.job}", permit)
        self._free(node_id, announce=False)
        self.grant_waiting([node_id])

    def _end(self, permit: PermitRecord, duration_s: float) -> ReleaseResult:
        """The permit's last nodes released: it turns RELEASED and the job's next phase is queued."""
        state = self.state
        name, epoch = permit.job, permit.epoch
        job = state.jobs[name]
        transition(permit, PERMIT_TRANSITIONS, PermitState.RELEASED, now=state.wall(), reason="released")
        freed = permit.nodes
        for n in freed:
            self._free(n, announce=False)
        phase, it = next_phase(permit.phase, permit.iteration)
        roll, train = self._estimates(permit, duration_s)
        iter_roll, iter_train = self.learning.measured(name, permit, duration_s)
        nxt = PermitRecord(job=name, phase=phase, iteration=it, epoch=epoch, last_released_epoch=epoch,
                           observed_roll_s=roll, observed_train_s=train, iter_roll_s=iter_roll, iter_train_s=iter_train)
        state.permits[name] = nxt
        state.touch(f"permit/{name}", nxt)
        self._enqueue(nxt)
        if self._continues_turn(job, permit.phase):
            nxt.asked_at = nxt.queued_at  # the phase follows at once on the same nodes: no ask awaited
        state.notify(Notice(kind=NoticeKind.JOB, job=name))  # an ask that came early waits for this
        self.grant_waiting(list(freed) + list(state.phase_nodes(job, phase)))
        return ReleaseResult(next_phase=phase, next_iteration=it, already_released=False)

    def _continues_turn(self, job: JobRecord, ended: Phase) -> bool:
        """Whether the phase after `ended` keeps the turn `ended` held (Train -> Sync; a co-located
        Rollout -> its Train): it is a request as soon as it is queued."""
        if ended is Phase.TRAIN:
            return True
        member = self.state.placement.groups[job.group_id].members.get(job.name) if job.group_id else None
        return ended is Phase.ROLLOUT and member is not None and member.colocated

    def _estimates(self, permit: PermitRecord, duration_s: float) -> tuple[float, float]:
        """The job's (rollout, train) time estimates with the released phase's duration folded in."""
        a = self.state.config.estimate_alpha
        roll, train = permit.observed_roll_s, permit.observed_train_s
        if permit.phase is Phase.ROLLOUT:
            roll = duration_s if not roll else a * duration_s + (1 - a) * roll
        elif permit.phase is Phase.TRAIN:
            train = duration_s if not train else a * duration_s + (1 - a) * train
        else:  # sync is part of T_train in the policy: add it to the last train sample
            train += a * duration_s
        return roll, train

    def advance(self, name: str, epoch: int, duration_s: float, *,
                node_id: str = "") -> tuple[ReleaseResult, PermitRecord | None]:
        """Release the phase held with `epoch` (on `node_id` alone, as `release`) and ask for the next
        one, as one transition.

        Returns:
            The release result and the next phase's permit (GRANTED when its nodes were free); None
            while other nodes of the permit still hold the phase (`held_nodes`: nothing is asked yet).

        Raises:
            StaleEpochError / InvalidArgumentError: as `release`; nothing changed.
        """
        res = self.release(name, epoch, duration_s, node_id=node_id)
        if res.held_nodes:
            return res, None
        permit = self.acquire(name, res.next_phase, res.next_iteration)
        assert permit is not None  # an admitted job (it held a lease) always has a permit
        return res, permit

    def expire(self) -> list[str]:
        """Revoke every lease past its TTL on every node it holds; returns the jobs whose lease expired.
        A lease that lapsed on some of its nodes only frees those (`_lapse_nodes`) and holds the others
        for their own sidecars' release. A lease whose node went LOST is no longer renewed by its
        heartbeats and lapses here like any other."""
        state = self.state
        now = state.clock()
        expired: list[str] = []
        for permit in [p for p in state.permits.values() if p.state is PermitState.GRANTED]:
            lapsed = tuple(n for n in permit.nodes if permit.expires_at.get(n, 0.0) <= now)
            if not lapsed:
                continue
            if len(lapsed) < len(permit.nodes):
                self._lapse_nodes(permit, lapsed)
            else:
                self._expire(permit, f"TTL {state.config.lease_ttl_s}s lapsed")
                expired.append(permit.job)
        return expired

    def _lapse_nodes(self, permit: PermitRecord, lapsed: tuple[str, ...]) -> None:
        """Some nodes of a lease lapsed (their sidecar stopped renewing it): free them alone, fenced by a
        revocation to them; the lease holds its other nodes until their sidecars release them."""
        permit.nodes = tuple(n for n in permit.nodes if n not in lapsed)
        permit.lapsed_nodes = (*permit.lapsed_nodes, *lapsed)
        permit.freed_nodes = (*permit.freed_nodes, *lapsed)
        for n in lapsed:
            permit.expires_at.pop(n, None)
            self._free(n)
        self.state.notify(Notice(kind=NoticeKind.REVOKED, job=permit.job, nodes=lapsed, epoch=permit.epoch,
                                 reason="lease lapsed on this node"))
        self.state.touch(f"permit/{permit.job}", permit)
        self.grant_waiting(lapsed)

    def _expire(self, permit: PermitRecord, reason: str) -> None:
        """End the lease EXPIRED on the nodes it still holds (fenced: its holders hear a revocation);
        the job is parked until it asks again."""
        state = self.state
        transition(permit, PERMIT_TRANSITIONS, PermitState.EXPIRED, now=state.wall(), reason=reason)
        freed = permit.nodes
        for n in freed:
            self._free(n)
        state.notify(Notice(kind=NoticeKind.REVOKED, job=permit.job, nodes=freed, epoch=permit.epoch,
                            reason="lease expired"))
        state.notify(Notice(kind=NoticeKind.JOB, job=permit.job))
        permit.nodes, permit.expires_at = (), {}
        state.touch(f"permit/{permit.job}", permit)
        self.grant_waiting(freed)

    def next_expiry(self) -> float | None:
        deadlines = [t for p in self.state.permits.values() if p.state is PermitState.GRANTED
                     for t in p.expires_at.values()]
        return min(deadlines, default=None)

    def cancel(self, name: str, reason: str) -> None:
        """The job is removed: its permit ends in any state (a held lease is revoked) and is deleted."""
        permit = self.state.permits.pop(name, None)
        if permit is None:
            return
        if permit.state is PermitState.GRANTED:
            for n in permit.nodes:
                self._free(n)
            self.state.notify(Notice(kind=NoticeKind.REVOKED, job=name, nodes=permit.nodes,
                                     epoch=permit.epoch, reason=reason))
        transition(permit, PERMIT_TRANSITIONS, PermitState.CANCELLED, now=self.state.wall(), reason=reason)
        self.state.forget(f"permit/{name}")

    def take_back(self, permit: PermitRecord, reason: str, *, requeued: str = "relocated") -> None:
        """A grant made but never picked up is revoked and its phase queued again (a relocation
        switches the job at this boundary). No-op for a permit not GRANTED."""
        if permit.state is not PermitState.GRANTED:
            return
        for n in permit.nodes:
            self._free(n)
        self.state.notify(Notice(kind=NoticeKind.REVOKED, job=permit.job, nodes=permit.nodes, epoch=permit.epoch,
                                 reason=reason))
        transition(permit, PERMIT_TRANSITIONS, PermitState.REVOKED, now=self.state.wall(), reason=reason)
        transition(permit, PERMIT_TRANSITIONS, PermitState.QUEUED, now=self.state.wall(), reason=requeued)
        permit.nodes, permit.asked_at = (), 0.0

    def restore(self, permits: dict[str, PermitRecord]) -> None:
        """Load stored permits (coordinator restart): every one waits from now; a held lease restarts
        its TTL (its holder could not renew while the coordinator was away) and counts as picked up
        (it may be running: a relocation waits for the next boundary)."""
        state = self.state
        state.permits.update(permits)
        now = state.clock()
        for p in state.permits.values():
            p.queued_at = now
            p.asked_at = 0.0  # asks to the previous leader are lost: a job that waits asks again (and borrows)
            if p.state is PermitState.GRANTED:
                p.expires_at = dict.fromkeys(p.nodes, now + state.config.lease_ttl_s)
                p.picked = True
                for n in p.nodes:
                    self.holder[n] = p.job
