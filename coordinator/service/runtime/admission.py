"""Job registration, admission (placement by the policy onto free nodes) and removal."""

from __future__ import annotations

from rollmux.coordinator.policy.state import GroupState
from rollmux.coordinator.service.api import AlreadyExistsError, JobState, NodeState, PermitState
from rollmux.coordinator.service.records import GroupRecord, JobRecord, PermitRecord
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import JOB_TRANSITIONS, PERMIT_TRANSITIONS, transition
from rollmux.model import JobSpec, Phase, Pool


class Admission(GrantQueues):
    """Registering jobs, admitting them in arrival order, removing them."""

    def register_job(self, spec: JobSpec, *, token_sha256: str, nonce_sha256: str,
                     relayed_by: str = "") -> tuple[JobRecord, bool]:
        """Register a resolved job spec; returns (record, rotated) where rotated means a retried
        registration with the same nonce (its token is replaced by the new one). `relayed_by` names
        the node whose sidecar relayed the registration.

        Raises:
            AlreadyExistsError: the name is taken by a registration with another nonce.
        """
        existing = self.jobs.get(spec.name)
        if existing is not None:
            if existing.nonce_sha256 != nonce_sha256:
                raise AlreadyExistsError(f"job {spec.name!r} is already registered: deregister it first, "
                                         "or retry with the nonce of the first registration")
            existing.token_sha256 = token_sha256
            self._touch(f"job/{spec.name}", existing)
            return existing, True
        self.meta.seq += 1
        job = JobRecord(name=spec.name, spec=spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256,
                        seq=self.meta.seq, relayed_by=relayed_by)
        self.jobs[spec.name] = job
        self._touch("meta", self.meta)
        self._touch(f"job/{spec.name}", job)
        self.try_admit()
        return job, False

    def _free_nodes(self, pool: Pool) -> list[str]:
        used: set[str] = set()
        for g in self.groups.values():
            used.update(g.train_nodes)
            used.update(g.rollout_nodes)
        return sorted(n.node_id for n in self.nodes.values()
                      if n.pool is pool and n.state is NodeState.READY and n.node_id not in used)

    def try_admit(self) -> list[str]:
        """Admit pending jobs strictly in arrival order while the free nodes can host them."""
        admitted = []
        for name in self.pending():
            if not self._admit(self.jobs[name]):
                break  # head-of-line: later arrivals wait for the earlier one
            admitted.append(name)
        return admitted

    def _admit(self, job: JobRecord) -> bool:
        decision = self.policy.place(job.spec, self.placement)
        free = {Pool.ROLLOUT: self._free_nodes(Pool.ROLLOUT), Pool.TRAIN: self._free_nodes(Pool.TRAIN)}
        if len(free[Pool.ROLLOUT]) < decision.new_rollout_nodes or len(free[Pool.TRAIN]) < decision.new_train_nodes:
            return False

        def allocate(pool: Pool, count: int) -> list[str]:
            taken, free[pool] = free[pool][:count], free[pool][count:]
            return taken

        group = self.placement.apply(job.spec, decision, allocate=allocate)
        member = group.members[job.name]
        job.group_id, job.rollout_nodes, job.train_nodes = group.group_id, member.rollout_nodes, group.train_nodes
        job.placement = decision.explain()
        transition(job, JOB_TRANSITIONS, JobState.ADMITTED, now=self.wall(), reason=f"placed in {group.group_id}")
        self._sync_group(group.group_id)
        self._touch(f"job/{job.name}", job)
        permit = PermitRecord(job=job.name, phase=Phase.ROLLOUT, iteration=0)
        self.permits[job.name] = permit
        self._enqueue(permit, job)
        self._notify(Notice(kind=NoticeKind.JOB, job=job.name))
        self._pump(job.rollout_nodes)
        return True

    def _sync_group(self, gid: str) -> None:
        g: GroupState | None = self.placement.groups.get(gid)
        if g is None:
            self.groups.pop(gid, None)
            self._dirty[f"group/{gid}"] = lambda: None
            return
        rec = GroupRecord(group_id=gid, train_nodes=tuple(g.train_nodes), rollout_nodes=tuple(g.rollout),
                          members=tuple(g.members))
        self.groups[gid] = rec
        self._touch(f"group/{gid}", rec)

    def remove_job(self, name: str, *, reason: str) -> list[str]:
        """Remove a job in any state; revokes its lease. Returns the nodes its group released."""
        job = self.job(name)
        released: list[str] = []
        permit = self.permits.pop(name, None)
        if permit is not None:
            self._cancel_permit(permit, job, reason)
            self._dirty[f"permit/{name}"] = lambda: None
        if job.state is JobState.ADMITTED:
            released = self.placement.remove_job(name)
            self._sync_group(job.group_id)
        transition(job, JOB_TRANSITIONS, JobState.REMOVED, now=self.wall(), reason=reason)
        del self.jobs[name]
        self._dirty[f"job/{name}"] = lambda: None
        self._notify(Notice(kind=NoticeKind.JOB, job=name, reason=reason))
        touched = set(job.rollout_nodes) | set(job.train_nodes)
        self._pump(sorted(touched))
        self.try_admit()
        return released

    def _cancel_permit(self, permit: PermitRecord, job: JobRecord, reason: str) -> None:
        if permit.state is PermitState.GRANTED:
            for n in permit.nodes:
                self._free_node(n)
            self._notify(Notice(kind=NoticeKind.REVOKED, job=job.name, nodes=permit.nodes,
                                epoch=permit.epoch, reason=reason))
        elif permit.state is PermitState.QUEUED:
            self._dequeue(permit, job)
        transition(permit, PERMIT_TRANSITIONS, PermitState.CANCELLED, now=self.wall(), reason=reason)

