"""Regrouping in the live service: relocation directives with an epoch, switched at an iteration boundary.

When a job leaves (deregistered or removed), the policy's regroup plan (`policy.regroup.plan_moves`)
looks at the members of the group it left. A single move worth making becomes a directive
{job, from group, to group, epoch, deadline} (``relocation/<job>``), sent to the job's nodes and on
to its ranks (the same path as long-tail migration: node stream -> sidecar -> shim). The job
honours it at an iteration boundary: it checkpoints, acknowledges (`ack_relocation`), re-attaches
on its new nodes and reloads its state. The acknowledgement switches the membership in one
transition: the job leaves its group (nodes no member needs are released), joins the target, keeps
its next phase and iteration (so its on-policy order goes on), and the membership gets a new
fencing epoch. A job that has not acknowledged by the deadline keeps its place (EXPIRED) and is not
asked again.

Safety: a switch never touches a held node. It is accepted only while the job's next phase is a
Rollout no rank has been handed (a grant made on the old nodes but not yet picked up is revoked
first), and the grant step gives each node to one permit. The move is re-planned when the job
acknowledges; if it no longer saves $/h or no longer fits, the directive is CANCELLED and the job
stays. At most one directive is pending in the cluster at a time (each plan is made against the
state the previous switch left), and each job moves at most `policy.regroup.move_cap` times
(`PolicyConfig.max_moves_per_job`, one more for a pool merge's survivor), as in the simulator.
Pair merges (two lone jobs into one new group) are left to the simulator.
"""

from __future__ import annotations

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementDecision
from rollmux.coordinator.policy.regroup import freed_usd_per_h, move_cap, plan_moves
from rollmux.coordinator.service.api import FailedPreconditionError, PermitState
from rollmux.coordinator.service.records import JobRecord, PermitRecord, RelocationRecord
from rollmux.coordinator.service.runtime.admission import decision_fits
from rollmux.coordinator.service.runtime.migration import LongTailMigration
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import PERMIT_TRANSITIONS, RELOCATION_TRANSITIONS, transition
from rollmux.model import Phase, Pool, RelocationState

class Relocations(LongTailMigration):
    """Planning relocation directives on departures, switching them on acknowledgement, expiring them."""

    # ------------------------------------------------------------------------------------ planning
    def _departed(self, name: str, group_id: str) -> None:
        self._forget_learned(name)
        if self.relocations.pop(name, None) is not None:
            self._dirty[f"relocation/{name}"] = lambda: None
        self.plan_relocations([group_id])

    def _remaining_s(self, name: str) -> float:
        """Work assumed left for `name` when weighing a move (0: never move it again)."""
        job, rec = self.jobs.get(name), self.relocations.get(name)
        if (job is None or not isinstance(self.policy, RollMuxPolicy)
                or job.moves >= move_cap(self.placement, self.policy.config, name)
                or (rec is not None and rec.state is RelocationState.EXPIRED)):
            return 0.0
        return self.config.relocation_horizon_s

    def plan_relocations(self, group_ids: list[str]) -> RelocationRecord | None:
        """Issue one directive for a member of `group_ids` that the policy finds worth moving."""
        if not isinstance(self.policy, RollMuxPolicy) or not self.policy.config.regroup:
            return None
        if any(r.state is RelocationState.PENDING for r in self.relocations.values()):
            return None  # one move at a time: the next is planned on the state this one leaves
        names = [n for gid in group_ids if (g := self.placement.groups.get(gid)) is not None for n in g.members]
        for name in names:
            moves = plan_moves(self.placement, self.policy, [name], self._remaining_s)
            if len(moves) != 1 or not self._fits_free(moves[0].decision):
                continue  # none, a pair merge (new group for two: simulator only), or no free nodes
            return self._issue(name, moves[0].from_group, moves[0].decision, moves[0].reason)
        return None

    def _fits_free(self, decision: PlacementDecision) -> bool:
        spec = self.jobs[decision.job].spec
        return decision_fits(decision, {Pool.ROLLOUT: self._free_nodes(Pool.ROLLOUT, spec.rollout_state_bytes or 0),
                                Pool.TRAIN: self._free_nodes(Pool.TRAIN, spec.train_state_bytes or 0)})

    def _issue(self, name: str, from_group: str, decision: PlacementDecision, reason: str) -> RelocationRecord:
        self.meta.epoch += 1
        self._touch("meta", self.meta)
        rec = RelocationRecord(job=name, from_group=from_group, to_group=decision.group_id or "",
                               epoch=self.meta.epoch, deadline_unix_s=self.wall() + self.config.relocation_deadline_s,
                               reason=reason)
        self.relocations[name] = rec
        self._touch(f"relocation/{name}", rec)
        self._notify(Notice(kind=NoticeKind.RELOCATE, job=name, nodes=self._job_nodes(self.jobs[name]),
                            epoch=rec.epoch, reason=reason))
        return rec

    def _job_nodes(self, job: JobRecord) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.phase_nodes(job, Phase.ROLLOUT), *self.phase_nodes(job, Phase.TRAIN)]))

    def relocation_notices(self, node_id: str) -> list[Notice]:
        """Pending directives a (re)connecting node's sidecar should hear of again."""
        return [Notice(kind=NoticeKind.RELOCATE, job=r.job, nodes=(node_id,), epoch=r.epoch, reason=r.reason)
                for r in self.relocations.values()
                if r.state is RelocationState.PENDING and r.job in self.jobs
                and node_id in self._job_nodes(self.jobs[r.job])]

    # ----------------------------------------------------------------------------------- switching
    def ack_relocation(self, name: str, epoch: int) -> tuple[RelocationRecord, str]:
        """The job honours directive `epoch`: switch its membership now if it is at an iteration boundary.

        Idempotent: a directive already switched, expired or cancelled is returned as it is.

        Returns:
            The directive (SWITCHED: the job's new nodes; still PENDING: retry at the next boundary)
            and a note saying why it is in that state.

        Raises:
            FailedPreconditionError: `epoch` names no directive of the job.
        """
        job = self.job(name)
        rec = self.relocations.get(name)
        if rec is None or rec.epoch != epoch:
            latest = "none" if rec is None else f"epoch {rec.epoch} ({rec.state.value})"
            raise FailedPreconditionError(f"job {name!r} has no relocation directive with epoch {epoch} (latest: "
                                          f"{latest}): act only on the directive rollmux.relocation() returns")
        if rec.state is not RelocationState.PENDING:
            return rec, f"directive already {rec.state.value}"
        if self.wall() >= rec.deadline_unix_s:
            self._end(rec, RelocationState.EXPIRED, "deadline passed before the job acknowledged")
            return rec, "deadline passed: the job keeps its place"
        permit = self.permits.get(name)
        if permit is None or permit.phase is not Phase.ROLLOUT or (permit.state is PermitState.GRANTED and permit.picked):
            what = "no permit" if permit is None else f"{permit.phase.value}({permit.iteration}) {permit.state.value}"
            return rec, f"not at an iteration boundary (the job holds {what}): acknowledge again before the next Rollout"
        decision = self.policy.place(job.spec, self.placement, exclude=rec.from_group)
        group = self.placement.groups[rec.from_group]
        saving = freed_usd_per_h(group, name) - decision.delta_usd_per_h
        if (decision.group_id or "") != rec.to_group or saving <= 1e-9 or not self._fits_free(decision):
            self._end(rec, RelocationState.CANCELLED, f"no longer worth it or possible (now: {decision.explain()})")
            return rec, "cancelled: the move no longer saves or fits; the job keeps its place"
        self._switch(job, permit, rec, decision)
        return rec, f"switched to {job.group_id}"

    def _switch(self, job: JobRecord, permit: PermitRecord, rec: RelocationRecord, decision: PlacementDecision) -> None:
        """Move `job` out of its group into `decision`'s, atomically, keeping its next phase."""
        name, old_nodes = job.name, self._job_nodes(job)
        if permit.state is PermitState.GRANTED:  # granted on the old nodes, never handed out: take it back
            for n in permit.nodes:
                self._free_node(n)
            self._notify(Notice(kind=NoticeKind.REVOKED, job=name, nodes=permit.nodes, epoch=permit.epoch,
                                reason="relocating"))
            transition(permit, PERMIT_TRANSITIONS, PermitState.REVOKED, now=self.wall(), reason="relocating")
            transition(permit, PERMIT_TRANSITIONS, PermitState.QUEUED, now=self.wall(), reason="relocated")
            permit.nodes = ()
        self._leave_rings(job)
        released = self.placement.remove_job(name)
        for n in released:
            self._set_served(n, None)
        self._sync_group(rec.from_group)
        free = {Pool.ROLLOUT: self._free_nodes(Pool.ROLLOUT, job.spec.rollout_state_bytes or 0),
                Pool.TRAIN: self._free_nodes(Pool.TRAIN, job.spec.train_state_bytes or 0)}

        def allocate(pool: Pool, count: int) -> list[str]:
            taken, free[pool] = free[pool][:count], free[pool][count:]
            return taken

        group = self.placement.apply(job.spec, decision, allocate=allocate)
        job.group_id, job.rollout_nodes = group.group_id, group.members[name].rollout_nodes
        job.deployment, job.placement, job.moves = decision.deployment.value, decision.explain(), job.moves + 1
        job.history.append((job.state.value, job.state.value, round(self.wall(), 3),
                            f"relocated {rec.from_group} -> {group.group_id} (directive epoch {rec.epoch})"))
        self._sync_group(group.group_id)
        self._touch(f"job/{name}", job)
        self._joined(name)
        self.meta.epoch += 1  # the new membership's fencing epoch
        self._touch("meta", self.meta)
        rec.switched_epoch, rec.to_group = self.meta.epoch, group.group_id
        rec.rollout_nodes, rec.train_nodes = self.phase_nodes(job, Phase.ROLLOUT), self.phase_nodes(job, Phase.TRAIN)
        self._end(rec, RelocationState.SWITCHED, f"acknowledged; released {','.join(released) or 'no nodes'}")
        self._touch(f"permit/{name}", permit)
        self._enqueue(permit)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=tuple(released)))
        self._notify(Notice(kind=NoticeKind.JOB, job=name))
        self._pump([*old_nodes, *self._job_nodes(job)])
        self.try_admit()
        self.plan_relocations([rec.from_group])

    def _end(self, rec: RelocationRecord, state: RelocationState, reason: str) -> None:
        transition(rec, RELOCATION_TRANSITIONS, state, now=self.wall(), reason=reason)
        self._touch(f"relocation/{rec.job}", rec)
        job = self.jobs.get(rec.job)
        nodes = tuple(dict.fromkeys([*(self._job_nodes(job) if job else ()), *rec.rollout_nodes, *rec.train_nodes]))
        self._notify(Notice(kind=NoticeKind.RELOCATE, job=rec.job, nodes=nodes, epoch=rec.epoch, reason=reason))

    # ------------------------------------------------------------------------------------ deadlines
    def expire(self) -> list[str]:
        """Leases past their TTL (see `Leases.expire`), and directives past their deadline (the job stays)."""
        expired = super().expire()
        now = self.wall()
        for rec in list(self.relocations.values()):
            if rec.state is RelocationState.PENDING and rec.deadline_unix_s <= now:
                self._end(rec, RelocationState.EXPIRED, "deadline passed before the job acknowledged")
        return expired

    def next_deadline(self) -> float | None:
        pending = [self.clock() + (r.deadline_unix_s - self.wall()) for r in self.relocations.values()
                   if r.state is RelocationState.PENDING]
        base = super().next_deadline()
        return min([*pending, *([] if base is None else [base])], default=None)

    @property
    def deadline_horizon_s(self) -> float:
        return min(super().deadline_horizon_s, self.config.relocation_deadline_s)
