"""Regrouping in the live service: relocation directives with an epoch, switched at an iteration boundary.

When a job leaves (deregistered or removed), the policy's regroup plan (`policy.regroup.plan_moves`)
looks at the members of the group it left; after a learning event (a member's phase times became
learned, `runtime.learning`; `PolicyConfig.regroup_on_learn`), at the members of its group. Before
either, a member whose learned times put it over its SLO budget is rescued (`regroup.plan_rescue`,
`rescue`), as in the simulator. The move it chooses (with `PolicyConfig.best_move`, the
one saving the most $) becomes one directive per moving job {job, from group, to group, epoch,
deadline} (`runtime.directives`), sent to the job's nodes and on to its ranks (the same path as
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

Owns: the jobs' `moves` counts. Calls Directives (the directive records), PhaseLearning (queued
learning events, forgetting a departed job), Admission (membership, free nodes, admitting) and
Leases (taking back an unpicked grant, queueing and granting).
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
from rollmux.coordinator.service.runtime.admission import Admission
from rollmux.coordinator.service.runtime.api import FailedPreconditionError, PermitState
from rollmux.coordinator.service.runtime.directives import Directives
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.leases import Leases
from rollmux.coordinator.service.runtime.records import JobRecord, PermitRecord, RelocationRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.core.model import Phase, Pool, RelocationState


class Relocations:
    """Planning relocation directives on departures and learning events, switching them on
    acknowledgement, expiring them."""

    def __init__(self, state: RuntimeState, directives: Directives, learning: PhaseLearning, admission: Admission,
                 leases: Leases) -> None:
        self.state = state
        self.directives = directives
        self.learning = learning
        self.admission = admission
        self.leases = leases

    def _regrouping(self) -> RollMuxPolicy | None:
        """The policy when it regroups (`PolicyConfig.regroup`), else None."""
        policy = self.state.policy
        return policy if isinstance(policy, RollMuxPolicy) and policy.config.regroup else None

    # ------------------------------------------------------------------------------------ planning
    def departed(self, name: str, group_id: str) -> None:
        """A job left `group_id`: forget what was learned of it, drop its directive (a merge it was part
        of cannot complete), and rescue or plan moves for the group it left."""
        self.learning.forget(name)
        rec = self.directives.drop(name)
        gids = [group_id]
        if rec is not None and rec.state is RelocationState.PENDING:
            for partner in self.directives.partners(rec):  # a merge it was part of cannot complete
                if partner.state is RelocationState.PENDING:
                    self.directives.end(partner, RelocationState.CANCELLED, f"job {name} of the same move left")
                elif partner.state is RelocationState.SWITCHED:
                    gids.append(partner.to_group)  # the first half stays: look at that group again
        if self.rescue(group_id) is None:
            self.plan_relocations(gids)

    def plan_deferred(self) -> RelocationRecord | None:
        """Look at the oldest queued group (at-risk ones first, `PhaseLearning.next_event`): a rescue,
        else (with `regroup_on_learn`) a move that saves $, as after a departure.

        Left queued while a directive is pending (one move at a time: the search would issue nothing),
        so no learning event is dropped; a group that has gone since is skipped.
        """
        if self.directives.any_pending():
            return None
        group_id = self.learning.next_event()
        if group_id is None:
            return None
        rec = self.rescue(group_id)
        policy = self.state.policy
        if rec is None and isinstance(policy, RollMuxPolicy) and policy.config.regroup_on_learn:
            rec = self.plan_relocations([group_id])
        return rec

    def rescue(self, group_id: str) -> RelocationRecord | None:
        """Direct a member of `group_id` whose learned times put its period over its SLO budget to where
        the policy now places it (`regroup.plan_rescue`: taken whatever it saves, if the downtime fits its
        SLO slack), as the simulator does after a departure or a learning event. Only the worst member
        at risk that may still move is looked at. Returns its directive, or None."""
        policy = self._regrouping()
        if policy is None or self.learning.learner is None:
            return None
        group = self.state.placement.groups.get(group_id)
        if group is None or self.directives.any_pending():
            return None
        config = policy.config
        for name in slo_risks(group, config):
            if self.state.jobs[name].moves < config.max_moves_per_job and group.members[name].profile.learned:
                moves = plan_rescue(self.state.placement, policy, name, self.remaining_s(name))
                if moves and self._fits_in_order([(m.job, m.decision) for m in moves]):
                    return self.directives.issue(moves)
                return None
        return None

    def _at_risk(self, name: str, group_id: str) -> bool:
        group = self.state.placement.groups.get(group_id)
        policy = self.state.policy
        return (group is not None and isinstance(policy, RollMuxPolicy)
                and name in slo_risks(group, policy.config) and group.members[name].profile.learned)

    def remaining_s(self, name: str) -> float:
        """Work assumed left for `name` when weighing a move (0: never move it again), in the unit of
        `regroup.RemainingFn`: solo seconds at the job's planned (spec) speed, as the simulator counts
        them (iterations left x planned T_solo). The live coordinator assumes `relocation_horizon_s` more
        of run at the speed it measured: horizon / learned T_solo iterations. Passing the bare horizon
        made a pool merge, which counts iterations as remaining / planned T_solo, weigh its saving over
        learned / planned of the horizon (never directed once learned times are a tenth of planned)."""
        state = self.state
        job, rec = state.jobs.get(name), self.directives.relocations.get(name)
        if (job is None or not isinstance(state.policy, RollMuxPolicy)
                or job.moves >= move_cap(state.placement, state.policy.config, name)
                or (rec is not None and rec.state is RelocationState.EXPIRED)):
            return 0.0
        group = state.placement.groups.get(job.group_id)
        member = group.members.get(name) if group is not None else None
        if member is None or not member.profile.learned or member.profile.t_solo_s <= 0:
            return state.config.relocation_horizon_s  # planned speed assumed until measured
        # the learned T_solo is capped by the planned one (`PhaseLearner`): the horizon only grows
        return state.config.relocation_horizon_s * member.spec.t_solo_s / member.profile.t_solo_s

    def plan_relocations(self, group_ids: list[str]) -> RelocationRecord | None:
        """Issue the directives of one move (a single move, or a pair or pool merge: one directive per
        moving job, one epoch) that the policy finds worth making for a member of `group_ids`.

        Returns the first moving job's directive, or None.
        """
        policy = self._regrouping()
        if policy is None:
            return None
        if self.directives.any_pending():
            return None  # one move at a time: the next is planned on the state this one leaves
        groups = self.state.placement.groups
        names = [n for gid in group_ids if (g := groups.get(gid)) is not None for n in g.members]
        for name in names:
            moves = plan_moves(self.state.placement, policy, [name], self.remaining_s)
            if moves and self._fits_in_order([(m.job, m.decision) for m in moves]):
                return self.directives.issue(moves)
        return None

    def _released_by(self, name: str) -> list[str]:
        """Nodes `name` leaving its group would release (the whole group when it is alone)."""
        group = self.state.placement.groups[self.state.jobs[name].group_id]
        if len(group.members) == 1:
            return [*group.train_nodes, *group.rollout]
        return [n for n in group.members[name].rollout_nodes if group.rollout[n].jobs == [name]]

    def _fits_in_order(self, steps: list[tuple[str, PlacementDecision]]) -> bool:
        """The fixed fleet hosts `steps` (job, decision) switched one at a time in this order: each
        job's new nodes come from the nodes free then, counting those it and the earlier steps release
        (a job switches at its iteration boundary, holding no node)."""
        spare = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}  # released by the steps so far, less what they took
        for name, decision in steps:
            spec = self.state.jobs[name].spec
            for n in self._released_by(name):
                spare[self.state.nodes[n].pool] += 1
            spare[Pool.ROLLOUT] -= decision.new_rollout_nodes
            spare[decision.train_pool] -= decision.new_train_nodes
            free = {Pool.ROLLOUT: len(self.admission.free_nodes(Pool.ROLLOUT, spec.rollout_state_bytes or 0)),
                    Pool.TRAIN: len(self.admission.free_nodes(Pool.TRAIN, spec.train_state_bytes or 0))}
            if any(free[p] + spare[p] < 0 for p in spare):
                return False
        return True

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
        state = self.state
        job = state.job(name)
        rec = self.directives.relocations.get(name)
        if rec is None or rec.epoch != epoch:
            latest = "none" if rec is None else f"epoch {rec.epoch} ({rec.state.value})"
            raise FailedPreconditionError(f"job {name!r} has no relocation directive with epoch {epoch} (latest: "
                                          f"{latest}): act only on the directive rollmux.relocation() returns")
        if rec.state is not RelocationState.PENDING:
            return rec, f"directive already {rec.state.value}"
        if state.wall() >= rec.deadline_unix_s:
            self.plan_relocations(self.directives.expire(rec))
            return rec, "deadline passed: the job keeps its place"
        permit = state.permits.get(name)
        if permit is None or permit.phase is not Phase.ROLLOUT or (permit.state is PermitState.GRANTED and permit.picked):
            what = "no permit" if permit is None else f"{permit.phase.value}({permit.iteration}) {permit.state.value}"
            return rec, f"not at an iteration boundary (the job holds {what}): acknowledge again before the next Rollout"
        partners = self.directives.partners(rec)
        if partners:
            return self._ack_merge(job, permit, rec, partners)
        return self._ack_single(job, permit, rec)

    def _ack_single(self, job: JobRecord, permit: PermitRecord, rec: RelocationRecord) -> tuple[RelocationRecord, str]:
        """A single move, re-planned now: switched if it still pays (or rescues) and fits, else CANCELLED."""
        name, placement = job.name, self.state.placement
        group = placement.groups[rec.from_group]
        profile = group.members[name].profile  # planned as the regroup plan did: learned times where confident
        decision = self.state.policy.place(job.spec, placement, exclude=rec.from_group,
                                           profile=profile if profile.learned else None)
        saving = freed_usd_per_h(group, name) - decision.delta_usd_per_h
        pays = saving > 1e-9 or self._at_risk(name, rec.from_group)  # a rescue is taken whatever it saves
        if (decision.group_id or "") != rec.to_group or not pays or not self._fits_in_order([(name, decision)]):
            self.directives.end(rec, RelocationState.CANCELLED,
                                f"no longer worth it or possible (now: {decision.explain()})")
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
            return self._join_merged(job, permit, rec, partner)
        end = self.directives.end
        if partner.state is not RelocationState.PENDING:
            end(rec, RelocationState.CANCELLED, f"{partner.job}'s half of the move was {partner.state.value}")
            return rec, "cancelled: the other job of the merge did not move; the job keeps its place"
        moves = self._replan_merge(name, partner.job)
        if moves is None or not self._fits_in_order([(m.job, m.decision) for m in moves]):
            for r in (rec, partner):
                end(r, RelocationState.CANCELLED, "the merge no longer saves or fits")
            return rec, "cancelled: the merge no longer saves or fits; the job keeps its place"
        if moves[0].job != name:
            return rec, (f"waiting for {partner.job} to switch first (it opens the merged group): acknowledge again "
                         "at the next iteration boundary")
        self._switch(job, permit, rec, moves[0].decision)
        self.directives.retarget(partner, job.group_id)  # the second half joins the group the first opened
        return rec, f"switched to {job.group_id}"

    def _join_merged(self, job: JobRecord, permit: PermitRecord, rec: RelocationRecord,
                     partner: RelocationRecord) -> tuple[RelocationRecord, str]:
        """A merge's second half joins the group its first half opened, if it still can."""
        placement = self.state.placement
        if rec.to_group not in placement.groups:  # the merged group is gone (its job left)
            self.directives.end(rec, RelocationState.CANCELLED, f"{partner.job}'s group {rec.to_group} is gone")
            return rec, "cancelled: the group to join is gone; the job keeps its place"
        member = placement.groups[rec.from_group].members[job.name]
        decision = merge_join(placement, job.spec, rec.to_group, member.profile)
        if decision is None or not self._fits_in_order([(job.name, decision)]):
            self.directives.end(rec, RelocationState.CANCELLED, f"can no longer join {rec.to_group} (SLO or free nodes)")
            self.plan_relocations([rec.to_group])  # the first half's job may go back
            return rec, "cancelled: the merge no longer fits; the job keeps its place"
        self._switch(job, permit, rec, decision)
        return rec, f"switched to {job.group_id}"

    def _replan_merge(self, a: str, b: str) -> list[Move] | None:
        """The merge of jobs a and b if the policy, asked again for either, still chooses it."""
        for name in (a, b):
            moves = plan_moves(self.state.placement, self.state.policy, [name], self.remaining_s)  # type: ignore[arg-type]
            if len(moves) == 2 and {m.job for m in moves} == {a, b}:
                return moves
        return None

    def _switch(self, job: JobRecord, permit: PermitRecord, rec: RelocationRecord, decision: PlacementDecision) -> None:
        """Move `job` out of its group into `decision`'s, atomically, keeping its next phase."""
        state = self.state
        old_nodes = state.job_nodes(job)
        self.leases.take_back(permit, "relocating")  # granted on the old nodes, never handed out
        released = self.admission.unplace(job)
        group = self.admission.place(job, decision)
        job.moves += 1
        job.history.append((job.state.value, job.state.value, round(state.wall(), 3),
                            f"relocated {rec.from_group} -> {group.group_id} (directive epoch {rec.epoch})"))
        self.directives.switched(rec, job, f"acknowledged; released {','.join(released) or 'no nodes'}")
        self.leases.requeue(permit)
        state.notify(Notice(kind=NoticeKind.NODE, nodes=tuple(released)))
        state.notify(Notice(kind=NoticeKind.JOB, job=job.name))
        self.leases.grant_waiting([*old_nodes, *state.job_nodes(job)])
        self.admission.try_admit()
        self.plan_relocations([rec.from_group])

    # ------------------------------------------------------------------------------------ deadlines
    def expire(self) -> None:
        """End the directives past their deadline (the job stays) and look again at the merged groups
        whose second half now never comes."""
        again: list[str] = []
        for rec in self.directives.due():
            again += self.directives.expire(rec)
        if again:
            self.plan_relocations(again)
