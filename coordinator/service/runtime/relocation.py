"""Regrouping in the live service: relocation directives with an epoch, switched at an iteration boundary.

When a job leaves (deregistered or removed), the policy's regroup plan (`policy.regroup.plan_moves`)
looks at the members of the group it left; after a learning event (a member's phase times became
learned, `runtime.learning`; `PolicyConfig.regroup_on_learn`), at the members of its group. Before
either, a member whose learned times put it over its SLO budget is rescued (`regroup.plan_rescue`,
`rescue`), as in the simulator. The move it chooses (with `PolicyConfig.best_move`, the
one saving the most $) becomes one directive per moving job {job, from group, to group, epoch,
deadline} (``relocation/<job>``), sent to the job's nodes and on to its ranks (the same path as
long-tail migration: node stream -> sidecar -> shim). The job honours it at an iteration boundary:
it checkpoints, acknowledges (`ack_relocation`), re-attaches on its new nodes and reloads its state.
The acknowledgement switches the membership in one transition: the job leaves its group (nodes no
member needs are released), joins the target, keeps its next phase and iteration (so its on-policy
order goes on), and the membership gets a new fencing epoch. A job that has not acknowledged by the
deadline keeps its place (EXPIRED) and is not asked again.

Merges (a pair or pool merge: two lone jobs into one new group) are two directives with one epoch,
issued together, each switched on its own job's acknowledgement. The first half (`Move` order:
the job whose placement opens the merged group) switches when the merge, re-planned then, still
pays and fits the free nodes; it then sits alone in the new group. The second joins that group at
its own boundary (`regroup.merge_join` re-checks the join; an acknowledgement that comes first
waits for the next boundary). If the second half expires or no longer fits, the first stays alone
in its group (a valid placement, looked at again by the planner); if the first half does not
switch, neither does the second.

Safety: a switch never touches a held node. It is accepted only while the job's next phase is a
Rollout no rank has been handed (a grant made on the old nodes but not yet picked up is revoked
first), takes new nodes only from the free ones (counting those the job's leaving releases), and
the grant step gives each node to one permit. A single move is re-planned when the job
acknowledges; if it no longer saves $/h or no longer fits, the directive is CANCELLED and the job
stays. At most one move is pending in the cluster at a time (each plan is made against the state
the previous switch left), and each job moves at most `policy.regroup.move_cap` times
(`PolicyConfig.max_moves_per_job`, one more for a pool merge's survivor), as in the simulator.
The fixed fleet buys no node: a move whose halves do not fit the free nodes in order is not directed.

Re-attaching: a job registered through its node's sidecar holds its token only in its own driver; after
a switch its restarted driver registers again through a sidecar of one of its new nodes, and gets the
same job with a fresh token (`_reattach_refusal` says when; once per switched directive).
"""
from __future__ import annotations

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementDecision
from rollmux.coordinator.policy.regroup import (
    Move,
    freed_usd_per_h,
    merge_join,
    move_cap,
    plan_moves,
    plan_rescue,
    slo_risks,
)
from rollmux.coordinator.service.api import FailedPreconditionError, PermitState
from rollmux.coordinator.service.records import JobRecord, PermitRecord, RelocationRecord
from rollmux.coordinator.service.runtime.migration import LongTailMigration
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import PERMIT_TRANSITIONS, RELOCATION_TRANSITIONS, transition
from rollmux.model import JobSpec, Phase, Pool, RelocationState


class Relocations(LongTailMigration):
    """Planning relocation directives on departures, switching them on acknowledgement, expiring them."""

    # ------------------------------------------------------------------------------------ planning
    def _departed(self, name: str, group_id: str) -> None:
        self._forget_learned(name)
        rec = self.relocations.pop(name, None)
        if rec is not None:
            self._dirty[f"relocation/{name}"] = lambda: None
        gids = [group_id]
        if rec is not None and rec.state is RelocationState.PENDING:
            for partner in self._partners(rec):  # a merge it was part of cannot complete
                if partner.state is RelocationState.PENDING:
                    self._end(partner, RelocationState.CANCELLED, f"job {name} of the same move left")
                elif partner.state is RelocationState.SWITCHED:
                    gids.append(partner.to_group)  # the first half stays: look at that group again
        if self.rescue(group_id) is None:
            self.plan_relocations(gids)

    def _became_learned(self, name: str, group_id: str) -> None:
        """Queue the group for the paced planner (`plan_deferred`): a rescue search, or a search for a
        move that saves $, walks every group of the cluster (~10 ms at 2,000 groups), too long for the
        transition that releases a Sync. A group with a member at SLO risk (group-local check) goes
        to the front."""
        if self._at_risk_group(group_id):
            self.rescue_due[group_id] = None
        elif isinstance(self.policy, RollMuxPolicy) and self.policy.config.regroup_on_learn:
            self.replan[group_id] = None

    def plan_deferred(self) -> RelocationRecord | None:
        """Look at the oldest queued group (at-risk ones first): a rescue, else (with
        `regroup_on_learn`) a move that saves $, as after a departure.

        Left queued while a directive is pending (one move at a time: the search would issue nothing),
        so no learning event is dropped; a group that has gone since is skipped.
        """
        if any(r.state is RelocationState.PENDING for r in self.relocations.values()):
            return None
        for queue in (self.rescue_due, self.replan):
            while queue:
                group_id = next(iter(queue))
                del queue[group_id]
                if group_id not in self.placement.groups:
                    continue
                rec = self.rescue(group_id)
                if rec is None and isinstance(self.policy, RollMuxPolicy) and self.policy.config.regroup_on_learn:
                    rec = self.plan_relocations([group_id])
                return rec
        return None

    def _at_risk_group(self, group_id: str) -> bool:
        group = self.placement.groups.get(group_id)
        return (group is not None and isinstance(self.policy, RollMuxPolicy)
                and any(group.members[n].profile.learned for n in slo_risks(group, self.policy.config)))

    def rescue(self, group_id: str) -> RelocationRecord | None:
        """Direct a member of `group_id` whose learned times put its period over its SLO budget to where
        the policy now places it (`regroup.plan_rescue`: taken whatever it saves, if the downtime fits its
        SLO slack), as the simulator does after a departure or a learning event. Only the worst member
        at risk that may still move is looked at. Returns its directive, or None."""
        if not isinstance(self.policy, RollMuxPolicy) or not self.policy.config.regroup or self.learner is None:
            return None
        group = self.placement.groups.get(group_id)
        if group is None or any(r.state is RelocationState.PENDING for r in self.relocations.values()):
            return None
        config = self.policy.config
        for name in slo_risks(group, config):
            if self.jobs[name].moves < config.max_moves_per_job and group.members[name].profile.learned:
                moves = plan_rescue(self.placement, self.policy, name, self._remaining_s(name))
                if moves and self._fits_in_order([(m.job, m.decision) for m in moves]):
                    return self._issue(moves)
                return None
        return None

    def _at_risk(self, name: str, group_id: str) -> bool:
        group = self.placement.groups.get(group_id)
        return (group is not None and isinstance(self.policy, RollMuxPolicy)
                and name in slo_risks(group, self.policy.config) and group.members[name].profile.learned)

    def _remaining_s(self, name: str) -> float:
        """Work assumed left for `name` when weighing a move (0: never move it again), in the unit of
        `regroup.RemainingFn`: solo seconds at the job's planned (spec) speed, as the simulator counts
        them (iterations left x planned T_solo). The live coordinator assumes `relocation_horizon_s` more
        of run at the speed it measured: horizon / learned T_solo iterations. Passing the bare horizon
        made a pool merge, which counts iterations as remaining / planned T_solo, weigh its saving over
        learned / planned of the horizon (never directed once learned times are a tenth of planned)."""
        job, rec = self.jobs.get(name), self.relocations.get(name)
        if (job is None or not isinstance(self.policy, RollMuxPolicy)
                or job.moves >= move_cap(self.placement, self.policy.config, name)
                or (rec is not None and rec.state is RelocationState.EXPIRED)):
            return 0.0
        group = self.placement.groups.get(job.group_id)
        member = group.members.get(name) if group is not None else None
        if member is None or not member.profile.learned or member.profile.t_solo_s <= 0:
            return self.config.relocation_horizon_s  # planned speed assumed until measured
        # the learned T_solo is capped by the planned one (`PhaseLearner`): the horizon only grows
        return self.config.relocation_horizon_s * member.spec.t_solo_s / member.profile.t_solo_s

    def plan_relocations(self, group_ids: list[str]) -> RelocationRecord | None:
        """Issue the directives of one move (a single move, or a pair or pool merge: one directive per
        moving job, one epoch) that the policy finds worth making for a member of `group_ids`.

        Returns the first moving job's directive, or None.
        """
        if not isinstance(self.policy, RollMuxPolicy) or not self.policy.config.regroup:
            return None
        if any(r.state is RelocationState.PENDING for r in self.relocations.values()):
            return None  # one move at a time: the next is planned on the state this one leaves
        names = [n for gid in group_ids if (g := self.placement.groups.get(gid)) is not None for n in g.members]
        for name in names:
            moves = plan_moves(self.placement, self.policy, [name], self._remaining_s)
            if moves and self._fits_in_order([(m.job, m.decision) for m in moves]):
                return self._issue(moves)
        return None

    def _released_by(self, name: str) -> list[str]:
        """Nodes `name` leaving its group would release (the whole group when it is alone)."""
        group = self.placement.groups[self.jobs[name].group_id]
        if len(group.members) == 1:
            return [*group.train_nodes, *group.rollout]
        return [n for n in group.members[name].rollout_nodes if group.rollout[n].jobs == [name]]

    def _fits_in_order(self, steps: list[tuple[str, PlacementDecision]]) -> bool:
        """The fixed fleet hosts `steps` (job, decision) switched one at a time in this order: each
        job's new nodes come from the nodes free then, counting those it and the earlier steps release
        (a job switches at its iteration boundary, holding no node)."""
        spare = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}  # released by the steps so far, less what they took
        for name, decision in steps:
            spec = self.jobs[name].spec
            for n in self._released_by(name):
                spare[self.nodes[n].pool] += 1
            spare[Pool.ROLLOUT] -= decision.new_rollout_nodes
            spare[decision.train_pool] -= decision.new_train_nodes
            free = {Pool.ROLLOUT: len(self._free_nodes(Pool.ROLLOUT, spec.rollout_state_bytes or 0)),
                    Pool.TRAIN: len(self._free_nodes(Pool.TRAIN, spec.train_state_bytes or 0))}
            if any(free[p] + spare[p] < 0 for p in spare):
                return False
        return True

    def _issue(self, moves: list[Move]) -> RelocationRecord:
        """One directive per moving job, all named by one new epoch (that is what ties a merge's halves)."""
        self.meta.epoch += 1
        self._touch("meta", self.meta)
        deadline = self.wall() + self.config.relocation_deadline_s
        recs = []
        for m in moves:
            to = (m.decision.group_id or "") if len(moves) == 1 else ""  # a merge's group does not exist yet
            rec = RelocationRecord(job=m.job, from_group=m.from_group, to_group=to, epoch=self.meta.epoch,
                                   deadline_unix_s=deadline, reason=m.reason)
            self.relocations[m.job] = rec
            self._touch(f"relocation/{m.job}", rec)
            self._notify(Notice(kind=NoticeKind.RELOCATE, job=m.job, nodes=self._job_nodes(self.jobs[m.job]),
                                epoch=rec.epoch, reason=m.reason))
            recs.append(rec)
        return recs[0]

    def _partners(self, rec: RelocationRecord) -> list[RelocationRecord]:
        """The other directives of the move `rec` belongs to (same epoch); [] for a single move."""
        return [r for r in self.relocations.values() if r.epoch == rec.epoch and r.job != rec.job]

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
            self.plan_relocations(self._expire_directive(rec))
            return rec, "deadline passed: the job keeps its place"
        permit = self.permits.get(name)
        if permit is None or permit.phase is not Phase.ROLLOUT or (permit.state is PermitState.GRANTED and permit.picked):
            what = "no permit" if permit is None else f"{permit.phase.value}({permit.iteration}) {permit.state.value}"
            return rec, f"not at an iteration boundary (the job holds {what}): acknowledge again before the next Rollout"
        partners = self._partners(rec)
        if partners:
            return self._ack_merge(job, permit, rec, partners)
        group = self.placement.groups[rec.from_group]
        profile = group.members[name].profile  # planned as the regroup plan did: learned times where confident
        decision = self.policy.place(job.spec, self.placement, exclude=rec.from_group,
                                     profile=profile if profile.learned else None)
        saving = freed_usd_per_h(group, name) - decision.delta_usd_per_h
        pays = saving > 1e-9 or self._at_risk(name, rec.from_group)  # a rescue is taken whatever it saves
        if (decision.group_id or "") != rec.to_group or not pays or not self._fits_in_order([(name, decision)]):
            self._end(rec, RelocationState.CANCELLED, f"no longer worth it or possible (now: {decision.explain()})")
            return rec, "cancelled: the move no longer saves or fits; the job keeps its place"
        self._switch(job, permit, rec, decision)
        return rec, f"switched to {job.group_id}"

    def _ack_merge(self, job: JobRecord, permit: PermitRecord, rec: RelocationRecord,
                   partners: list[RelocationRecord]) -> tuple[RelocationRecord, str]:
        """A pair or pool merge's job at its boundary. The first half (the job that opens the merged
        group, `Move` order) switches on its own acknowledgement when the re-planned merge still
        pays and fits; the second joins that group on its own, re-checked (`regroup.merge_join`).
        Every intermediate state is a valid placement: after the first half alone, its job sits in
        a group of its own."""
        name, (partner,) = job.name, partners
        if partner.state is RelocationState.SWITCHED:  # the first half is done: join its group
            if rec.to_group not in self.placement.groups:  # the merged group is gone (its job left)
                self._end(rec, RelocationState.CANCELLED, f"{partner.job}'s group {rec.to_group} is gone")
                return rec, "cancelled: the group to join is gone; the job keeps its place"
            member = self.placement.groups[rec.from_group].members[name]
            decision = merge_join(self.placement, job.spec, rec.to_group, member.profile)
            if decision is None or not self._fits_in_order([(name, decision)]):
                self._end(rec, RelocationState.CANCELLED, f"can no longer join {rec.to_group} (SLO or free nodes)")
                self.plan_relocations([rec.to_group])  # the first half's job may go back
                return rec, "cancelled: the merge no longer fits; the job keeps its place"
            self._switch(job, permit, rec, decision)
            return rec, f"switched to {job.group_id}"
        if partner.state is not RelocationState.PENDING:
            self._end(rec, RelocationState.CANCELLED, f"{partner.job}'s half of the move was {partner.state.value}")
            return rec, "cancelled: the other job of the merge did not move; the job keeps its place"
        moves = self._replan_merge(name, partner.job)
        if moves is None or not self._fits_in_order([(m.job, m.decision) for m in moves]):
            for r in (rec, partner):
                self._end(r, RelocationState.CANCELLED, "the merge no longer saves or fits")
            return rec, "cancelled: the merge no longer saves or fits; the job keeps its place"
        if moves[0].job != name:
            return rec, (f"waiting for {partner.job} to switch first (it opens the merged group): acknowledge again "
                         "at the next iteration boundary")
        self._switch(job, permit, rec, moves[0].decision)
        partner.to_group = job.group_id  # the second half joins the group the first opened
        self._touch(f"relocation/{partner.job}", partner)
        return rec, f"switched to {job.group_id}"

    def _replan_merge(self, a: str, b: str) -> list[Move] | None:
        """The merge of jobs a and b if the policy, asked again for either, still chooses it."""
        for name in (a, b):
            moves = plan_moves(self.placement, self.policy, [name], self._remaining_s)  # type: ignore[arg-type]
            if len(moves) == 2 and {m.job for m in moves} == {a, b}:
                return moves
        return None

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

    # -------------------------------------------------------------------------------- re-attaching
    def _reattach_refusal(self, job: JobRecord, node_id: str) -> str | None:
        """A self-registered job (relayed) may re-attach once after its latest directive SWITCHED, through
        a sidecar of one of its new nodes: its restarted driver cannot prove it is the same job otherwise
        (the token lived in the old driver's Ray instance)."""
        rec = self.relocations.get(job.name)
        if not job.relayed_by:
            return "it was registered with the operator token, which its restart keeps using"
        if rec is None or rec.state is not RelocationState.SWITCHED:
            latest = "none" if rec is None else f"epoch {rec.epoch} {rec.state.value}"
            return f"its latest relocation directive is not switched ({latest})"
        if rec.reattached_by:
            return f"it already re-attached after directive epoch {rec.epoch}, through node {rec.reattached_by!r}"
        nodes = self._job_nodes(job)
        if node_id not in nodes:
            return f"the node is not one of its nodes in {job.group_id} ({', '.join(nodes)})"
        return None

    def _reattach(self, job: JobRecord, spec: JobSpec, *, token_sha256: str, nonce_sha256: str, node_id: str) -> None:
        """The job side (`Admission._reattach`), then mark the directive re-attached (one-shot)."""
        super()._reattach(job, spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256, node_id=node_id)
        rec = self.relocations[job.name]
        rec.reattached_by = node_id
        self._touch(f"relocation/{job.name}", rec)

    # ------------------------------------------------------------------------------------ deadlines
    def expire(self) -> list[str]:
        """Leases past their TTL (see `Leases.expire`), and directives past their deadline (the job stays)."""
        expired = super().expire()
        now = self.wall()
        again: list[str] = []
        for rec in list(self.relocations.values()):
            if rec.state is RelocationState.PENDING and rec.deadline_unix_s <= now:
                again += self._expire_directive(rec)
        if again:
            self.plan_relocations(again)
        return expired

    def _expire_directive(self, rec: RelocationRecord) -> list[str]:
        """End `rec` past its deadline (the job keeps its place); returns the groups to look at again: a
        merge's group whose first half switched and whose second half now never comes."""
        self._end(rec, RelocationState.EXPIRED, "deadline passed before the job acknowledged")
        return [p.to_group for p in self._partners(rec) if p.state is RelocationState.SWITCHED]

    def next_deadline(self) -> float | None:
        pending = [self.clock() + (r.deadline_unix_s - self.wall()) for r in self.relocations.values()
                   if r.state is RelocationState.PENDING]
        base = super().next_deadline()
        return min([*pending, *([] if base is None else [base])], default=None)

    @property
    def deadline_horizon_s(self) -> float:
        return min(super().deadline_horizon_s, self.config.relocation_deadline_s)
