"""The coordinator's runtime state and every transition on it, with no I/O.

`Runtime` holds the cluster as the coordinator sees it (nodes, jobs, the policy's groups, per-node
FIFO queues, permits and their leases) and changes it only through the methods below. Each method
validates first and raises a `ServiceError` before touching anything, then mutates, marks the
records it changed dirty and queues `Notice`s. The shell (`server.py`) takes the dirty records and
commits them to the store in one atomic batch before it answers, and delivers the notices to node
streams and waiting jobs. Time is injected (`clock`, monotonic seconds) so tests drive TTLs.

Runtime semantics (DESIGN.md, Intra-group scheduler):
- A job's phase waits in the FIFO queue of every node it needs: Rollout on the job's pinned rollout
  nodes, Train and Sync on the group's training nodes. A job's next phase is enqueued the moment its
  previous one is released, so each node serves its jobs in the round-robin order of the
  meta-iteration while granting the next phase as soon as the node is free (work-conserving). Sync
  continues Train: it goes to the head of the training queues, so nothing interleaves with it.
- A job is enqueued on all its nodes in one step, so any two jobs are in the same relative order in
  every queue they share: no cyclic wait.
- A grant holds every needed node with a lease (cluster-wide increasing epoch + TTL). At most one
  permit holds a node (`holder`), the safety invariant `check_invariants` asserts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum

from rollmux.coordinator.policy import ClusterState, RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.policy.state import GroupState
from rollmux.coordinator.service.api import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobState,
    NodeState,
    NotFoundError,
    PermitState,
    ServiceConfig,
    StaleEpochError,
)
from rollmux.coordinator.service.records import (
    GroupRecord,
    JobRecord,
    Meta,
    NodeRecord,
    PermitRecord,
    dumps,
    next_phase,
)
from rollmux.coordinator.service.states import (
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    PERMIT_PARKED,
    PERMIT_TRANSITIONS,
    transition,
)
from rollmux.model import ClusterSpec, JobSpec, Phase, Pool

Clock = Callable[[], float]


class NoticeKind(str, Enum):
    GRANTED = "granted"  # a permit was granted (wake the job, tell its nodes)
    REVOKED = "revoked"  # a lease ended other than by release (expired, drained, job removed)
    MIGRATE = "migrate"  # long-tail migration directive
    NODE = "node"  # a node's state or holder changed (re-send its snapshot)
    JOB = "job"  # a job's admission or permit changed (wake its waiters)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    """Something the shell must tell node streams or waiting jobs after the commit."""

    kind: NoticeKind
    job: str = ""
    nodes: tuple[str, ...] = ()  # nodes whose sidecars should hear of it
    epoch: int = 0
    reason: str = ""
    keep_nodes: tuple[str, ...] = ()  # MIGRATE only
    release_nodes: tuple[str, ...] = ()  # MIGRATE only


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseResult:
    next_phase: Phase
    next_iteration: int
    already_released: bool  # a retried release of the same epoch


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationDecision:
    job: str
    epoch: int
    keep_nodes: tuple[str, ...]
    release_nodes: tuple[str, ...]


class Runtime:
    """All live coordinator state; see the module docstring for the semantics."""

    def __init__(self, cluster: ClusterSpec, config: ServiceConfig, *, clock: Clock,
                 wall: Clock, policy: PlacementPolicy | None = None) -> None:
        self.cluster = cluster
        self.config = config
        self.clock = clock  # monotonic seconds (lease deadlines)
        self.wall = wall  # seconds since the epoch (histories)
        self.policy = policy or RollMuxPolicy()
        self.meta = Meta()
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.permits: dict[str, PermitRecord] = {}
        self.queues: dict[str, list[str]] = {}
        self.holder: dict[str, str] = {}  # node -> job whose GRANTED permit holds it
        self.groups: dict[str, GroupRecord] = {}
        self.placement = ClusterState(cluster)
        self.connected: set[str] = set()  # nodes with an open sidecar stream (memory only)
        self.freed_at: dict[str, float] = {}  # node -> when its last permit ended (memory only)
        self._dirty: dict[str, Callable[[], str | None]] = {}
        self._notices: list[Notice] = []

    # ------------------------------------------------------------------------------------------
    # change tracking
    # ------------------------------------------------------------------------------------------
    def take_changes(self) -> tuple[dict[str, str | None], list[Notice]]:
        """The records changed since the last call (key -> JSON, None = delete) and the notices."""
        writes = {k: render() for k, render in self._dirty.items()}
        notices = self._notices
        self._dirty, self._notices = {}, []
        return writes, notices

    def _touch(self, key: str, record: object | None) -> None:
        self._dirty[key] = (lambda: None) if record is None else record.to_json  # type: ignore[attr-defined]

    def _touch_queue(self, node_id: str) -> None:
        q = self.queues.get(node_id)
        self._dirty[f"queue/{node_id}"] = (lambda: None) if not q else (lambda q=q: dumps(q))

    def _notify(self, notice: Notice) -> None:
        self._notices.append(notice)

    # ------------------------------------------------------------------------------------------
    # lookups (raise NotFound)
    # ------------------------------------------------------------------------------------------
    def job(self, name: str) -> JobRecord:
        try:
            return self.jobs[name]
        except KeyError:
            raise NotFoundError(f"job {name!r} is not registered (deregistered, removed, or never "
                                "registered): register it first") from None

    def node(self, node_id: str) -> NodeRecord:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise NotFoundError(f"node {node_id!r} is not registered: start its sidecar, which "
                                "registers it") from None

    def pending(self) -> list[str]:
        return sorted((j.name for j in self.jobs.values() if j.state is JobState.PENDING),
                      key=lambda n: self.jobs[n].seq)

    def phase_nodes(self, job: JobRecord, phase: Phase) -> tuple[str, ...]:
        return job.rollout_nodes if phase is Phase.ROLLOUT else job.train_nodes

    # ------------------------------------------------------------------------------------------
    # nodes
    # ------------------------------------------------------------------------------------------
    def register_node(self, *, node_id: str, pool: Pool, gpu_type: str, gpu_count: int,
                      host_dram_bytes: int, nvml: dict[str, str]) -> NodeRecord:
        """Register a node, or refresh the facts of a known one (a restarted sidecar)."""
        existing = self.nodes.get(node_id)
        if existing is not None:
            if existing.pool is not pool:
                raise AlreadyExistsError(f"node {node_id!r} is registered in pool {existing.pool.value}, "
                                         f"not {pool.value}: give the node another id")
            existing.gpu_type, existing.gpu_count = gpu_type, gpu_count
            existing.host_dram_bytes, existing.nvml = host_dram_bytes, dict(nvml)
            self._touch(f"node/{node_id}", existing)
            return existing
        node = NodeRecord(node_id=node_id, pool=pool, gpu_type=gpu_type, gpu_count=gpu_count,
                          host_dram_bytes=host_dram_bytes, nvml=dict(nvml))
        self.nodes[node_id] = node
        self._touch(f"node/{node_id}", node)
        self.try_admit()
        return node

    def node_connected(self, node_id: str) -> None:
        node = self.node(node_id)
        self.connected.add(node_id)
        node.heard_at = self.clock()
        if not node.streams:
            node.streams = True
            self._touch(f"node/{node_id}", node)
        if node.state is NodeState.LOST:
            transition(node, NODE_TRANSITIONS, NodeState.READY, now=self.wall(), reason="sidecar reconnected")
            self._touch(f"node/{node_id}", node)
            self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
            self._pump([node_id])

    def node_disconnected(self, node_id: str) -> None:
        self.connected.discard(node_id)
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.READY:
            transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.wall(), reason="sidecar stream closed")
            self._touch(f"node/{node_id}", node)

    def heartbeat(self, node_id: str, active_epochs: Iterable[int]) -> None:
        """A sidecar heartbeat renews the lease holding its node if the node runs that epoch.

        A node that went LOST because its heartbeats lapsed (stream still open) is READY again.
        """
        node = self.node(node_id)
        node.heard_at = self.clock()
        if node.state is NodeState.LOST and node_id in self.connected:
            transition(node, NODE_TRANSITIONS, NodeState.READY, now=self.wall(), reason="heartbeats resumed")
            self._touch(f"node/{node_id}", node)
            self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
            self._pump([node_id])
        job = self.holder.get(node_id)
        if job is not None:
            permit = self.permits[job]
            if permit.epoch in set(active_epochs):
                permit.expires_at = self.clock() + self.config.lease_ttl_s

    def drain_node(self, node_id: str) -> NodeState:
        """Stop granting on a node and placing jobs on it; the running permit finishes."""
        node = self.node(node_id)
        if node.state in (NodeState.DRAINING, NodeState.DRAINED):
            return node.state
        transition(node, NODE_TRANSITIONS, NodeState.DRAINING, now=self.wall(), reason="operator drain")
        if node_id not in self.holder:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.wall(), reason="idle")
        self._touch(f"node/{node_id}", node)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
        return node.state

    def _grantable(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node_id in self.holder:
            return False
        if node.state is not NodeState.READY:
            return False
        return not node.streams or node_id in self.connected

    def _free_node(self, node_id: str) -> None:
        self.holder.pop(node_id, None)
        self.freed_at[node_id] = self.clock()
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.DRAINING:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.wall(), reason="permit ended")
            self._touch(f"node/{node_id}", node)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))

    # ------------------------------------------------------------------------------------------
    # jobs: registration and admission
    # ------------------------------------------------------------------------------------------
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

    # ------------------------------------------------------------------------------------------
    # queues and grants
    # ------------------------------------------------------------------------------------------
    def _enqueue(self, permit: PermitRecord, job: JobRecord) -> None:
        front = permit.phase is Phase.SYNC  # Sync continues Train on the training nodes
        permit.queued_at = self.clock()
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.setdefault(n, [])
            q.insert(0, job.name) if front else q.append(job.name)
            self._touch_queue(n)

    def _dequeue(self, permit: PermitRecord, job: JobRecord) -> None:
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.get(n)
            if q and job.name in q:
                q.remove(job.name)
                if not q:
                    del self.queues[n]
                self._touch_queue(n)

    def _pump(self, nodes: Iterable[str]) -> None:
        """Grant every queue head whose nodes are all free, ready and headed by it.

        A grant only consumes nodes, so one pass over the heads of the touched nodes suffices.
        """
        for n in list(dict.fromkeys(nodes)):
            q = self.queues.get(n)
            if not q:
                continue
            job = self.jobs[q[0]]
            permit = self.permits[job.name]
            needed = self.phase_nodes(job, permit.phase)
            if all(self.queues.get(m, [None])[0] == job.name and self._grantable(m) for m in needed):
                self._grant(permit, job, needed)

    def _grant(self, permit: PermitRecord, job: JobRecord, needed: tuple[str, ...]) -> None:
        self.meta.epoch += 1
        self._touch("meta", self.meta)
        for m in needed:
            self.queues[m].pop(0)
            if not self.queues[m]:
                del self.queues[m]
            self._touch_queue(m)
            self.holder[m] = job.name
        transition(permit, PERMIT_TRANSITIONS, PermitState.GRANTED, now=self.wall(),
                   reason=f"epoch {self.meta.epoch}")
        permit.epoch, permit.nodes, permit.migrated = self.meta.epoch, needed, False
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        permit.grantable_at = max([permit.queued_at, *(self.freed_at.get(m, 0.0) for m in needed)])
        self._touch(f"permit/{job.name}", permit)
        self._notify(Notice(kind=NoticeKind.GRANTED, job=job.name, nodes=needed, epoch=permit.epoch))

    # ------------------------------------------------------------------------------------------
    # permits: acquire, renew, release, progress, expiry
    # ------------------------------------------------------------------------------------------
    def acquire(self, name: str, phase: Phase, iteration: int) -> PermitRecord | None:
        """Ask for `phase` of `iteration`; returns the permit (GRANTED or QUEUED), or None while the
        job is pending admission. A GRANTED permit is renewed; a parked one is queued at the tail.

        Raises:
            NotFoundError: unknown job.
            FailedPreconditionError: the phase is not the job's next one in on-policy order.
        """
        job = self.job(name)
        permit = self.permits.get(name)
        expected = (permit.phase, permit.iteration) if permit else (Phase.ROLLOUT, 0)
        if (phase, iteration) != expected:
            raise FailedPreconditionError(
                f"job {name!r} asked for {phase.value}({iteration}) out of order: its next phase is "
                f"{expected[0].value}({expected[1]}) (Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1))")
        if permit is None:
            return None
        if permit.state is PermitState.GRANTED:
            permit.expires_at = self.clock() + self.config.lease_ttl_s
        elif permit.state in PERMIT_PARKED:
            transition(permit, PERMIT_TRANSITIONS, PermitState.QUEUED, now=self.wall(), reason="asked again")
            self._touch(f"permit/{name}", permit)
            self._enqueue(permit, job)
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
            self._free_node(n)
        phase, it = next_phase(permit.phase, permit.iteration)
        a = self.config.estimate_alpha
        roll, train = permit.observed_roll_s, permit.observed_train_s
        if permit.phase is Phase.ROLLOUT:
            roll = duration_s if not roll else a * duration_s + (1 - a) * roll
        elif permit.phase is Phase.TRAIN:
            train = duration_s if not train else a * duration_s + (1 - a) * train
        else:  # sync is part of T_train in the policy: add it to the last train sample
            train += a * duration_s
        nxt = PermitRecord(job=name, phase=phase, iteration=it, epoch=epoch, last_released_epoch=epoch,
                           observed_roll_s=roll, observed_train_s=train)
        self.permits[name] = nxt
        self._touch(f"permit/{name}", nxt)
        self._enqueue(nxt, job)
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

    def report_progress(self, name: str, epoch: int, finished: int, total: int) -> MigrationDecision | None:
        """Record rollout progress; once tail-bound, consolidate onto a few nodes (long-tail migration)."""
        if total <= 0 or finished < 0 or finished > total:
            raise InvalidArgumentError(f"progress finished={finished} total={total} is invalid: "
                                       "expected 0 <= finished <= total and total > 0")
        permit = self._granted(name, epoch, "report progress for")
        if permit.phase is not Phase.ROLLOUT:
            raise FailedPreconditionError(f"job {name!r} reported rollout progress while holding "
                                          f"{permit.phase.value}({permit.iteration}): report it during rollout")
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        done = finished / total
        if permit.migrated or done < self.config.migration_threshold or len(permit.nodes) < 2:
            return None
        waited = [n for n in permit.nodes if self.queues.get(n)]
        if not waited:
            return None  # nobody would use the freed nodes: keep running undisturbed
        keep_n = min(len(permit.nodes) - 1, max(1, math.ceil(len(permit.nodes) * (1.0 - done))))
        order = [n for n in permit.nodes if n not in waited] + waited
        keep, release = tuple(sorted(order[:keep_n])), tuple(sorted(order[keep_n:]))
        permit.nodes, permit.migrated = keep, True
        self._touch(f"permit/{name}", permit)
        for n in release:
            self._free_node(n)
        decision = MigrationDecision(job=name, epoch=epoch, keep_nodes=keep, release_nodes=release)
        self._notify(Notice(kind=NoticeKind.MIGRATE, job=name, nodes=keep + release, epoch=epoch,
                            keep_nodes=keep, release_nodes=release, reason=f"rollout {done:.0%} done"))
        self._pump(release)
        return decision

    def heartbeat_changes_state(self, node_id: str) -> bool:
        """Whether a heartbeat from `node_id` would change stored state (its node is LOST)."""
        node = self.nodes.get(node_id)
        return node is not None and node.state is NodeState.LOST

    def _lapsed_nodes(self, now: float) -> list[NodeRecord]:
        lapse = self.config.heartbeat_lapse_s
        return [node for n in self.connected if (node := self.nodes.get(n)) is not None
                and node.state is NodeState.READY and node.heard_at + lapse <= now]

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

    def wait_reason(self, name: str) -> str:
        """Why a job's permit is not granted yet, naming the blocker."""
        job = self.job(name)
        if job.state is JobState.PENDING:
            pos = self.pending().index(name) + 1
            return (f"job {name!r} is pending admission (position {pos}): the free nodes cannot host its "
                    "placement yet")
        permit = self.permits[name]
        if permit.state in PERMIT_PARKED:
            return f"job {name!r} {permit.phase.value}({permit.iteration}) lease {permit.state.value}"
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.get(n, [])
            if q and q[0] != name:
                return (f"{permit.phase.value}({permit.iteration}) queued at position {q.index(name) + 1} on "
                        f"node {n} behind job {q[0]!r}")
            if n in self.holder and self.holder[n] != name:
                return f"{permit.phase.value}({permit.iteration}) waits for node {n} held by job {self.holder[n]!r}"
            if not self._grantable(n) and n not in self.holder:
                return f"{permit.phase.value}({permit.iteration}) waits for node {n} ({self.nodes[n].state.value}, " \
                       f"{'connected' if n in self.connected else 'sidecar not connected'})"
        return f"{permit.phase.value}({permit.iteration}) {permit.state.value}"

    # ------------------------------------------------------------------------------------------
    # invariants and reload
    # ------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Mutual exclusion and queue consistency; raises AssertionError naming the violation."""
        held: dict[str, str] = {}
        for p in self.permits.values():
            if p.state is PermitState.GRANTED:
                for n in p.nodes:
                    assert n not in held, f"node {n} held by both {held[n]} and {p.job}"
                    held[n] = p.job
        assert held == self.holder, f"holder map {self.holder} disagrees with leases {held}"
        for n, q in self.queues.items():
            assert len(q) == len(set(q)), f"queue {n} repeats a job: {q}"
            for j in q:
                assert self.permits[j].state is PermitState.QUEUED, f"{j} in queue {n} but not queued"

    def records(self) -> dict[str, str]:
        """Every record in stored form (to seed a store)."""
        out = {"meta": self.meta.to_json()}
        out.update({f"node/{k}": v.to_json() for k, v in self.nodes.items()})
        out.update({f"job/{k}": v.to_json() for k, v in self.jobs.items()})
        out.update({f"permit/{k}": v.to_json() for k, v in self.permits.items()})
        out.update({f"group/{k}": v.to_json() for k, v in self.groups.items()})
        out.update({f"queue/{k}": dumps(v) for k, v in self.queues.items() if v})
        return out

    @classmethod
    def from_records(cls, records: dict[str, str], cluster: ClusterSpec, config: ServiceConfig, *,
                     clock: Clock, wall: Clock, policy: PlacementPolicy | None = None) -> Runtime:
        """Rebuild the runtime from stored records (coordinator restart or store recovery).

        Leases restart their TTL (holders could not renew while the coordinator was away); nodes with
        a sidecar start LOST until their sidecar reconnects.
        """
        import json

        rt = cls(cluster, config, clock=clock, wall=wall, policy=policy)
        if "meta" in records:
            rt.meta = Meta.from_json(records["meta"])
        for key, raw in records.items():
            kind, _, ident = key.partition("/")
            if kind == "node":
                rt.nodes[ident] = NodeRecord.from_json(raw)
            elif kind == "job":
                rt.jobs[ident] = JobRecord.from_json(raw)
            elif kind == "permit":
                rt.permits[ident] = PermitRecord.from_json(raw)
            elif kind == "queue":
                rt.queues[ident] = list(json.loads(raw))
            elif kind == "group":
                rt.groups[ident] = GroupRecord.from_json(raw)
        now = clock()
        for p in rt.permits.values():
            p.queued_at = now
            if p.state is PermitState.GRANTED:
                p.expires_at = now + config.lease_ttl_s
                for n in p.nodes:
                    rt.holder[n] = p.job
        for node in rt.nodes.values():
            if node.streams and node.state is NodeState.READY:
                transition(node, NODE_TRANSITIONS, NodeState.LOST, now=wall(), reason="coordinator restarted")
                rt._touch(f"node/{node.node_id}", node)
        rt._restore_placement()
        rt.check_invariants()
        return rt

    def _restore_placement(self) -> None:
        for gid, rec in sorted(self.groups.items(), key=lambda kv: _gid_number(kv[0])):
            members = [(self.jobs[name].spec, tuple(self.jobs[name].rollout_nodes)) for name in rec.members]
            self.placement.restore_group(gid, tuple(rec.train_nodes), tuple(rec.rollout_nodes), members)


def _gid_number(gid: str) -> int:
    digits = "".join(ch for ch in gid if ch.isdigit())
    return int(digits) if digits else 0


def resolved_spec(spec: JobSpec, cluster: ClusterSpec) -> JobSpec:
    """Fill missing times and state sizes with the profiler's estimates."""
    from rollmux.coordinator.profiler import resolve

    return resolve(spec, cluster)


__all__ = ["MigrationDecision", "Notice", "NoticeKind", "ReleaseResult", "Runtime", "replace", "resolved_spec"]
