"""Job registration, admission (placement by the policy onto free nodes) and removal.

Admission has no head-of-line blocking: every pending job the free nodes can host is admitted, in
arrival order, and one that must wait never holds back a later one that fits. A spec that no set
of nodes could ever hold is refused at registration, naming the limit.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.admission import place_pending
from rollmux.coordinator.policy.api import PlacementDecision, RejectReason
from rollmux.coordinator.policy.state import GroupState
from rollmux.coordinator.service.api import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobState,
    NodeState,
    PermitState,
)
from rollmux.coordinator.service.records import GroupRecord, JobRecord, PermitRecord
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import JOB_TRANSITIONS, PERMIT_TRANSITIONS, transition
from rollmux.model import Deployment, JobSpec, Phase, Pool

_SHAPE = ("n_rollout_gpus", "n_train_gpus", "rollout_state_bytes", "train_state_bytes", "deployment")
"""Spec fields a re-attaching job must send as registered: its placement was made for them."""


class Registered(str, Enum):
    """How `register_job` took a registration."""

    NEW = "new"  # a job not registered before
    RETRIED = "retried"  # the same nonce again (a retry whose answer was lost): the token is replaced
    REATTACHED = "reattached"  # a self-registered job restarted on its new nodes after a switch: new token


class Admission(GrantQueues):
    """Registering jobs, admitting them in arrival order, removing them."""

    def register_job(self, spec: JobSpec, *, token_sha256: str, nonce_sha256: str,
                     relayed_by: str = "") -> tuple[JobRecord, Registered]:
        """Register a resolved job spec; returns the record and how it was registered: NEW, RETRIED
        (the same nonce again: its token is replaced by the new one) or REATTACHED (a self-registered
        job restarted on its new nodes after a relocation, `Relocations._reattach`). `relayed_by`
        names the node whose sidecar relayed the registration.

        Raises:
            AlreadyExistsError: the name is taken by a registration with another nonce (and this is
                no re-attachment).
            FailedPreconditionError: a re-attachment whose spec does not match the registered one.
            InvalidArgumentError: no set of nodes could ever hold the job.
        """
        existing = self.jobs.get(spec.name)
        if existing is not None:
            if existing.nonce_sha256 == nonce_sha256:
                existing.token_sha256 = token_sha256
                self._touch(f"job/{spec.name}", existing)
                return existing, Registered.RETRIED
            taken = (f"job {spec.name!r} is already registered: deregister it first, "
                     "or retry with the nonce of the first registration")
            if not relayed_by:
                raise AlreadyExistsError(taken)
            refusal = self._reattach_refusal(existing, relayed_by)
            if refusal is not None:
                raise AlreadyExistsError(f"{taken} (node {relayed_by!r} may not re-attach it: {refusal})")
            self._reattach(existing, spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256, node_id=relayed_by)
            return existing, Registered.REATTACHED
        self._check_can_ever_fit(spec)
        self.meta.seq += 1
        job = JobRecord(name=spec.name, spec=spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256,
                        seq=self.meta.seq, relayed_by=relayed_by)
        if spec.deployment is not None:  # a fixed mode is known (and returned) before admission
            job.deployment = spec.deployment.value
        self.jobs[spec.name] = job
        self._touch("meta", self.meta)
        self._touch(f"job/{spec.name}", job)
        self.try_admit()
        return job, Registered.NEW

    # hooks runtime.relocation fills in: which jobs may re-attach, and marking their directive
    def _reattach_refusal(self, job: JobRecord, node_id: str) -> str | None:
        """Why `node_id`'s sidecar may not re-attach `job` after a relocation (None: it may)."""
        return "this coordinator relocates no job"

    def _reattach(self, job: JobRecord, spec: JobSpec, *, token_sha256: str, nonce_sha256: str, node_id: str) -> None:
        """Give `job` a new token and nonce, recording the relaying node; the job keeps its name, group,
        next phase and iteration. Validates first.

        Raises:
            FailedPreconditionError: `spec` differs from the registered spec in its shape.
        """
        old = job.spec
        differ = [f"{f} {getattr(spec, f)!r} (registered: {getattr(old, f)!r})" for f in _SHAPE
                  if getattr(spec, f) != getattr(old, f)]
        if differ:
            raise FailedPreconditionError(f"job {job.name!r} cannot re-attach with another shape: {', '.join(differ)}; "
                                          "restart it with the spec it registered with")
        job.token_sha256, job.nonce_sha256, job.relayed_by = token_sha256, nonce_sha256, node_id
        job.history.append((job.state.value, job.state.value, round(self.wall(), 3),
                            f"re-attached through node {node_id}'s sidecar (new token)"))
        self._touch(f"job/{job.name}", job)

    def _check_can_ever_fit(self, spec: JobSpec) -> None:
        cluster, limit = self.cluster, self.config.max_nodes_per_job
        for pool, gpus in ((Pool.ROLLOUT, spec.n_rollout_gpus), (Pool.TRAIN, spec.n_train_gpus)):
            nodes = cluster.nodes_for(gpus)
            if nodes > limit:
                raise InvalidArgumentError(
                    f"job {spec.name!r} asks for {gpus} {pool.value} GPUs = {nodes} nodes of {cluster.gpus_per_node}, "
                    f"over the limit of {limit} nodes per pool (max_nodes_per_job): no node set could ever "
                    "hold it; ask for fewer GPUs")
        for pool, state in ((Pool.ROLLOUT, spec.rollout_state_bytes), (Pool.TRAIN, spec.train_state_bytes)):
            dram = self._largest_dram(pool)
            if state is not None and state >= dram:
                raise InvalidArgumentError(
                    f"job {spec.name!r} {pool.value} state of {state} bytes per node does not fit the host DRAM "
                    f"of any {pool.value} node (largest {dram} bytes): no node could ever hold it")

    def _largest_dram(self, pool: Pool) -> int:
        return max([self.cluster.host_dram_bytes,
                    *(n.host_dram_bytes for n in self.nodes.values() if n.pool is pool)])

    def _free_nodes(self, pool: Pool, state_bytes: int) -> list[str]:
        """READY nodes of `pool` in no group whose host DRAM holds `state_bytes`."""
        used = self.placement.node_group
        return sorted(n.node_id for n in self.nodes.values()
                      if n.pool is pool and n.state is NodeState.READY and n.node_id not in used
                      and state_bytes < n.host_dram_bytes)

    def try_admit(self) -> list[str]:
        """Admit every pending job the free nodes can host now, in arrival order (no head-of-line
        blocking: a job that must wait never holds back a later one that fits)."""
        return [name for name in self.pending() if self._admit(self.jobs[name])]

    def _admit(self, job: JobRecord) -> bool:
        spec = job.spec
        free = {Pool.ROLLOUT: self._free_nodes(Pool.ROLLOUT, spec.rollout_state_bytes or 0),
                Pool.TRAIN: self._free_nodes(Pool.TRAIN, spec.train_state_bytes or 0)}
        decision = self._decide(job.spec, free)
        if decision is None:
            return False

        def allocate(pool: Pool, count: int) -> list[str]:
            taken, free[pool] = free[pool][:count], free[pool][count:]
            return taken

        group = self.placement.apply(job.spec, decision, allocate=allocate)
        job.group_id, job.rollout_nodes = group.group_id, group.members[job.name].rollout_nodes
        job.deployment = decision.deployment.value  # returned at registration; adapters build workers to match
        job.placement = decision.explain()
        transition(job, JOB_TRANSITIONS, JobState.ADMITTED, now=self.wall(), reason=f"placed in {group.group_id}")
        self._sync_group(group.group_id)
        self._touch(f"job/{job.name}", job)
        self._joined(job.name)
        permit = PermitRecord(job=job.name, phase=Phase.ROLLOUT, iteration=0)
        self.permits[job.name] = permit
        self._touch(f"permit/{job.name}", permit)  # stored even while queued: a reload must find it
        self._enqueue(permit)
        self._notify(Notice(kind=NoticeKind.JOB, job=job.name))
        self._pump(self.phase_nodes(job, Phase.ROLLOUT))
        return True

    def _decide(self, spec: JobSpec, free: dict[Pool, list[str]]) -> PlacementDecision | None:
        """The policy's decision for `spec` if the free nodes host it, else a fallback that they do.

        The fleet is what it is (the live coordinator buys no node), so when the cheapest mode
        needs nodes that are not free, fall back to the disaggregated placement (the paper's),
        which may fit the nodes there are. Either try falls back to `work_aware` off (`_on_fleet`).
        Returns None when nothing fits now (the job stays pending).
        """
        decision = self._on_fleet(spec, free)
        if not decision_fits(decision, free) and spec.deployment is None and decision.deployment is not Deployment.DISAGGREGATED:
            decision = self._on_fleet(replace(spec, deployment=Deployment.DISAGGREGATED), free)
        return decision if decision_fits(decision, free) else None

    def _on_fleet(self, spec: JobSpec, free: dict[Pool, list[str]]) -> PlacementDecision:
        """The policy's decision; if its new nodes are not free and the work-aware check refused a join
        (`occupancy`: the job would rather go alone on nodes the fleet does not have), the decision
        with `work_aware` off, which takes that join instead of leaving the job pending."""
        decision = place_pending(self.policy, spec, self.placement,  # knowing the jobs pending behind it
                                 [self.jobs[n].spec for n in self.pending() if n != spec.name])
        if (not decision_fits(decision, free) and isinstance(self.policy, RollMuxPolicy)
                and self.policy.config.work_aware
                and any(r.reason is RejectReason.OCCUPANCY for r in decision.rejections)):
            decision = self.policy.variant(work_aware=False).place(spec, self.placement)
        return decision

    def _sync_group(self, gid: str) -> None:
        """Store the group as the placement holds it (its stored form only; no copy in memory)."""
        g: GroupState | None = self.placement.groups.get(gid)
        self._touch(f"group/{gid}", None if g is None else group_record(g))

    def remove_job(self, name: str, *, reason: str) -> list[str]:
        """Remove a job in any state; revokes its lease. Returns the nodes its group released."""
        job = self.job(name)
        released: list[str] = []
        permit = self.permits.pop(name, None)
        if permit is not None:
            self._cancel_permit(permit, job, reason)
            self._dirty[f"permit/{name}"] = lambda: None
        group_train = self.phase_nodes(job, Phase.TRAIN)
        if job.state is JobState.ADMITTED:
            self._leave_rings(job)
            released = self.placement.remove_job(name)
            for n in released:
                self._set_served(n, None)
            self._sync_group(job.group_id)
        transition(job, JOB_TRANSITIONS, JobState.REMOVED, now=self.wall(), reason=reason)
        del self.jobs[name]
        self._dirty[f"job/{name}"] = lambda: None
        self._notify(Notice(kind=NoticeKind.JOB, job=name, reason=reason))
        touched = set(job.rollout_nodes) | set(group_train)
        self._pump(sorted(touched))
        self.try_admit()
        self._departed(name, job.group_id)
        return released

    def _cancel_permit(self, permit: PermitRecord, job: JobRecord, reason: str) -> None:
        if permit.state is PermitState.GRANTED:
            for n in permit.nodes:
                self._free_node(n)
            self._notify(Notice(kind=NoticeKind.REVOKED, job=job.name, nodes=permit.nodes,
                                epoch=permit.epoch, reason=reason))
        transition(permit, PERMIT_TRANSITIONS, PermitState.CANCELLED, now=self.wall(), reason=reason)



def decision_fits(decision: PlacementDecision, free: dict[Pool, list[str]]) -> bool:
    """The free nodes can host the decision's new nodes (a group co-located on rollout-pool GPUs
    takes its "training" nodes from the rollout pool)."""
    need = {Pool.ROLLOUT: decision.new_rollout_nodes, Pool.TRAIN: 0}
    need[decision.train_pool] += decision.new_train_nodes
    return all(len(free[p]) >= n for p, n in need.items())


def group_record(g: GroupState) -> GroupRecord:
    """The stored form of a group: its nodes and round-robin member order."""
    return GroupRecord(group_id=g.group_id, train_nodes=tuple(g.train_nodes), rollout_nodes=tuple(g.rollout),
                       members=tuple(g.members), train_pool=g.train_pool.value)
