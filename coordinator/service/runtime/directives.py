"""Relocation directives as records: issued, switched, expired or cancelled, and re-attachments.

A directive {job, from group, to group, epoch, deadline} (``relocation/<job>``) is a job's latest
regrouping order (`runtime.relocation` decides when to issue and switch one). Every state change
tells the job's nodes (old and new), which pass it on to its ranks.

Re-attaching: a job registered through its node's sidecar holds its token only in its own driver;
after a switch its restarted driver registers again through a sidecar of one of its new nodes, and
gets the same job with a fresh token (`reattach_refusal` says when; once per switched directive).

Owns: `relocations` (every directive record and its transitions). Calls nothing.
"""

from __future__ import annotations

from rollmux.coordinator.policy.regroup import Move
from rollmux.coordinator.service.runtime.records import JobRecord, RelocationRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.runtime.states import RELOCATION_TRANSITIONS, transition
from rollmux.core.model import Phase, RelocationState


class Directives:
    """Every job's latest relocation directive."""

    def __init__(self, state: RuntimeState) -> None:
        self.state = state
        self.relocations: dict[str, RelocationRecord] = {}  # job -> its latest regrouping directive

    def any_pending(self) -> bool:
        """A move is under way (one at a time: the next is planned on the state this one leaves)."""
        return any(r.state is RelocationState.PENDING for r in self.relocations.values())

    def issue(self, moves: list[Move]) -> RelocationRecord:
        """One directive per moving job, all named by one new epoch (that is what ties a merge's halves);
        returns the first."""
        state = self.state
        epoch = state.next_epoch()
        deadline = state.wall() + state.config.relocation_deadline_s
        recs = []
        for m in moves:
            to = (m.decision.group_id or "") if len(moves) == 1 else ""  # a merge's group does not exist yet
            rec = RelocationRecord(job=m.job, from_group=m.from_group, to_group=to, epoch=epoch,
                                   deadline_unix_s=deadline, reason=m.reason)
            self.relocations[m.job] = rec
            state.touch(f"relocation/{m.job}", rec)
            state.notify(Notice(kind=NoticeKind.RELOCATE, job=m.job, nodes=state.job_nodes(state.jobs[m.job]),
                                epoch=rec.epoch, reason=m.reason))
            recs.append(rec)
        return recs[0]

    def partners(self, rec: RelocationRecord) -> list[RelocationRecord]:
        """The other directives of the move `rec` belongs to (same epoch); [] for a single move."""
        return [r for r in self.relocations.values() if r.epoch == rec.epoch and r.job != rec.job]

    def end(self, rec: RelocationRecord, new: RelocationState, reason: str) -> None:
        state = self.state
        transition(rec, RELOCATION_TRANSITIONS, new, now=state.wall(), reason=reason)
        state.touch(f"relocation/{rec.job}", rec)
        job = state.jobs.get(rec.job)
        nodes = tuple(dict.fromkeys([*(state.job_nodes(job) if job else ()), *rec.rollout_nodes, *rec.train_nodes]))
        state.notify(Notice(kind=NoticeKind.RELOCATE, job=rec.job, nodes=nodes, epoch=rec.epoch, reason=reason))

    def switched(self, rec: RelocationRecord, job: JobRecord, reason: str) -> None:
        """The job moved into its new group (`job.group_id`): the directive records its new nodes and the
        new membership's fencing epoch."""
        state = self.state
        rec.switched_epoch, rec.to_group = state.next_epoch(), job.group_id
        rec.rollout_nodes, rec.train_nodes = state.phase_nodes(job, Phase.ROLLOUT), state.phase_nodes(job, Phase.TRAIN)
        self.end(rec, RelocationState.SWITCHED, reason)

    def retarget(self, rec: RelocationRecord, to_group: str) -> None:
        """A merge's second half joins the group its first half opened."""
        rec.to_group = to_group
        self.state.touch(f"relocation/{rec.job}", rec)

    def expire(self, rec: RelocationRecord) -> list[str]:
        """End `rec` past its deadline (the job keeps its place); returns the groups to look at again: a
        merge's group whose first half switched and whose second half now never comes."""
        self.end(rec, RelocationState.EXPIRED, "deadline passed before the job acknowledged")
        return [p.to_group for p in self.partners(rec) if p.state is RelocationState.SWITCHED]

    def due(self) -> list[RelocationRecord]:
        """Pending directives past their deadline."""
        now = self.state.wall()
        return [r for r in self.relocations.values()
                if r.state is RelocationState.PENDING and r.deadline_unix_s <= now]

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, in monotonic seconds."""
        state = self.state
        return min((state.clock() + (r.deadline_unix_s - state.wall()) for r in self.relocations.values()
                    if r.state is RelocationState.PENDING), default=None)

    def drop(self, name: str) -> RelocationRecord | None:
        """The job left: delete its directive; returns it."""
        rec = self.relocations.pop(name, None)
        if rec is not None:
            self.state.forget(f"relocation/{name}")
        return rec

    def notices_for(self, node_id: str) -> list[Notice]:
        """Pending directives a (re)connecting node's sidecar should hear of again."""
        state = self.state
        return [Notice(kind=NoticeKind.RELOCATE, job=r.job, nodes=(node_id,), epoch=r.epoch, reason=r.reason)
                for r in self.relocations.values()
                if r.state is RelocationState.PENDING and r.job in state.jobs
                and node_id in state.job_nodes(state.jobs[r.job])]

    def reattach_refusal(self, job: JobRecord, node_id: str) -> str | None:
        """Why `node_id`'s sidecar may not re-attach `job` (None: it may). A self-registered job
        (relayed) may re-attach once after its latest directive SWITCHED, through a sidecar of one of
        its new nodes: its restarted driver cannot prove it is the same job otherwise (the token lived
        in the old driver's Ray instance)."""
        rec = self.relocations.get(job.name)
        if not job.relayed_by:
            return "it was registered with the operator token, which its restart keeps using"
        if rec is None or rec.state is not RelocationState.SWITCHED:
            latest = "none" if rec is None else f"epoch {rec.epoch} {rec.state.value}"
            return f"its latest relocation directive is not switched ({latest})"
        if rec.reattached_by:
            return f"it already re-attached after directive epoch {rec.epoch}, through node {rec.reattached_by!r}"
        nodes = self.state.job_nodes(job)
        if node_id not in nodes:
            return f"the node is not one of its nodes in {job.group_id} ({', '.join(nodes)})"
        return None

    def reattached(self, name: str, node_id: str) -> None:
        """Mark the job's switched directive re-attached through `node_id` (one-shot)."""
        rec = self.relocations[name]
        rec.reattached_by = node_id
        self.state.touch(f"relocation/{name}", rec)

    def restore(self, relocations: dict[str, RelocationRecord]) -> None:
        """Load the stored directives (coordinator restart)."""
        self.relocations.update(relocations)

