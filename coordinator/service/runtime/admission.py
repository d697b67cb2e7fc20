"""Job registration, admission (placement by the policy onto free nodes) and removal.

Admission has no head-of-line blocking: every pending job the free nodes can host is admitted, in
arrival order, and one that must wait never holds back a later one that fits. A spec that no set
of nodes could ever hold is refused at registration, naming the limit.

The queue is looked at on every registration, departure and node coming back, but a job that did not
fit is decided again only when something its decision depends on changed: the capacity
(`RuntimeState.capacity_version`: nodes, groups, profiles, measured iterations, which move the fleet
prior a pending job is judged with), the pending jobs its lookahead sees, or the
nodes its ranks attached on. The policy is pure, so the same inputs give the same "does not fit"; with
1,000 jobs queued a registration no longer re-decides all of them. And when the capacity did change, a
job deep in the queue whose spec (but for its name, which RollMux's policy only uses as a key) equals one
found unfit earlier in the same pass, seeing the same pending jobs, is unfit too: a queue of many jobs
of a few shapes costs a few decisions per departure, not one per job.

Owns: the job records (`state.jobs`, ``job/<name>``: registration, admission, re-attachment,
removal; a relocation's `moves` count is the relocation part's), the placement's membership and the
stored groups (``group/<gid>``; `place` and `unplace` serve relocation too), and `meta.seq`. Calls
Leases (a job's first permit, its cancellation, granting), GrantQueues (turns a leaving job
passes on), PhaseLearning (a member joined) and Directives (re-attachment after a switch).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.admission import pinned_options, place_pending
from rollmux.coordinator.policy.api import PlacementDecision, PlacementPolicy, RejectReason
from rollmux.coordinator.policy.state import GroupState
from rollmux.coordinator.service.runtime.api import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobState,
    NodeState,
    PlacementMismatchError,
)
from rollmux.coordinator.service.runtime.directives import Directives
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.leases import Leases
from rollmux.coordinator.service.runtime.records import GroupRecord, JobRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.runtime.states import JOB_TRANSITIONS, transition
from rollmux.core.model import Deployment, JobSpec, Phase, Pool

_SHAPE = ("n_rollout_gpus", "n_train_gpus", "rollout_state_bytes", "train_state_bytes", "deployment")
"""Spec fields a re-attaching job must send as registered: its placement was made for them."""


class Registered(str, Enum):
    """How `register_job` took a registration."""

    NEW = "new"  # a job not registered before
    RETRIED = "retried"  # the same nonce again (a retry whose answer was lost): the token is replaced
    REATTACHED = "reattached"  # a self-registered job restarted on its new nodes after a switch: new token
    ATTACHED = "attached"  # the driver of a job registered on its behalf (attachable) took it over: new token


@dataclass(frozen=True, slots=True, kw_only=True)
class Unfit:
    """What a pending job's last decision saw when it did not fit: while all of it stays, so does the answer."""

    capacity_version: int  # RuntimeState.capacity_version then
    upcoming: tuple[str, ...]  # the pending jobs its lookahead saw, in order
    attach_nodes: tuple[str, ...]  # the nodes its ranks had attached on


class Admission:
    """Registering jobs, admitting them in arrival order, removing them."""

    def __init__(self, state: RuntimeState, leases: Leases, queues: GrantQueues, learning: PhaseLearning,
                 directives: Directives) -> None:
        self.state = state
        self.leases = leases
        self.queues = queues
        self.learning = learning
        self.directives = directives
        self.unfit: dict[str, Unfit] = {}  # pending job -> what it did not fit with (in memory only)
        self.remember_unfit = True  # False: decide every pending job on every event (what tests compare with)

    # ------------------------------------------------------------------------------ registration
    def register_job(self, spec: JobSpec, *, token_sha256: str, nonce_sha256: str,
                     relayed_by: str = "", attachable: bool = False) -> tuple[JobRecord, Registered]:
        """Register a resolved job spec; returns the record and how it was registered: NEW, RETRIED
        (the same nonce again: its token is replaced by the new one), REATTACHED (a self-registered
        job restarted on its new nodes after a relocation, `Directives.reattach_refusal`) or ATTACHED
        (the driver of a job registered `attachable` on its behalf, relayed by a node of its placement).
        `relayed_by` names the node whose sidecar relayed the registration.

        Raises:
            AlreadyExistsError: the name is taken by a registration with another nonce (and this is
                no re-attachment).
            FailedPreconditionError: a re-attachment whose spec does not match the registered one.
            InvalidArgumentError: no set of nodes could ever hold the job.
        """
        state = self.state
        existing = state.jobs.get(spec.name)
        if existing is not None:
            if existing.nonce_sha256 == nonce_sha256:
                existing.token_sha256 = token_sha256
                state.touch(f"job/{spec.name}", existing)
                return existing, Registered.RETRIED
            taken = (f"job {spec.name!r} is already registered: deregister it first, "
                     "or retry with the nonce of the first registration")
            if not relayed_by:
                raise AlreadyExistsError(taken)
            if existing.attachable:
                self._attach(existing, spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256,
                             node_id=relayed_by)
                return existing, Registered.ATTACHED
            refusal = self.directives.reattach_refusal(existing, relayed_by)
            if refusal is not None:
                raise AlreadyExistsError(f"{taken} (node {relayed_by!r} may not re-attach it: {refusal})")
            self._reattach(existing, spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256, node_id=relayed_by)
            return existing, Registered.REATTACHED
        self._check_can_ever_fit(spec)
        job = JobRecord(name=spec.name, spec=spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256,
                        seq=state.next_seq(), relayed_by=relayed_by, attachable=attachable)
        if spec.deployment is not None:  # a fixed mode is known (and returned) before admission
            job.deployment = spec.deployment.value
        state.jobs[spec.name] = job
        state.touch(f"job/{spec.name}", job)
        self.try_admit()
        return job, Registered.NEW

    def _attach(self, job: JobRecord, spec: JobSpec, *, token_sha256: str, nonce_sha256: str, node_id: str) -> None:
        """The driver of a job registered on its behalf takes the registration over (once), relayed
        by a node the job is placed on: its pods were bound there, so I4 holds by construction.

        Raises:
            AlreadyExistsError: the job is not admitted yet, or `node_id` is not one of its nodes.
            FailedPreconditionError: `spec` differs from the registered spec in its shape.
        """
        nodes = self.state.job_nodes(job) if job.state is JobState.ADMITTED else ()
        if node_id not in nodes:
            raise AlreadyExistsError(f"job {job.name!r} is registered on its behalf and placed on "
                                     f"{', '.join(nodes) or 'no nodes yet'}: node {node_id!r} may not attach it")
        self._reattach(job, spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256, node_id=node_id,
                       directed=False)
        job.attachable = False

    def _reattach(self, job: JobRecord, spec: JobSpec, *, token_sha256: str, nonce_sha256: str, node_id: str,
                  directed: bool = True) -> None:
        """Give `job` a new token and nonce, recording the relaying node, and mark its directive
        re-attached; the job keeps its name, group, next phase and iteration. Validates first.

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
        job.history.append((job.state.value, job.state.value, round(self.state.wall(), 3),
                            f"re-attached through node {node_id}'s sidecar (new token)"))
        self.state.touch(f"job/{job.name}", job)
        if directed:
            self.directives.reattached(job.name, node_id)

    def _check_can_ever_fit(self, spec: JobSpec) -> None:
        cluster, limit = self.state.cluster, self.state.config.max_nodes_per_job
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
        return max([self.state.cluster.host_dram_bytes,
                    *(n.host_dram_bytes for n in self.state.nodes.values() if n.pool is pool)])

    # --------------------------------------------------------------------------------- admission
    def free_nodes(self, pool: Pool, state_bytes: int) -> list[str]:
        """READY nodes of `pool` in no group whose host DRAM holds `state_bytes`."""
        used = self.state.placement.node_group
        return sorted(n.node_id for n in self.state.nodes.values()
                      if n.pool is pool and n.state is NodeState.READY and n.node_id not in used
                      and state_bytes < n.host_dram_bytes)

    def _free_for(self, spec: JobSpec) -> dict[Pool, list[str]]:
        return {Pool.ROLLOUT: self.free_nodes(Pool.ROLLOUT, spec.rollout_state_bytes or 0),
                Pool.TRAIN: self.free_nodes(Pool.TRAIN, spec.train_state_bytes or 0)}

    def try_admit(self) -> list[str]:
        """Admit every pending job the free nodes can host now, in arrival order (no head-of-line
        blocking: a job that must wait never holds back a later one that fits). A job is decided again
        only if what it did not fit with changed (`Unfit`); each admission changes the capacity, so
        the jobs after it are decided again in the same pass."""
        state = self.state
        pending, window = state.pending(), _lookahead(state.policy)
        name_blind = isinstance(state.policy, RollMuxPolicy)
        admitted: list[str] = []
        waiting: list[str] = []  # looked at in this pass and still pending: their lookahead sees them
        unfit_shapes: dict[tuple[object, ...], Unfit] = {}  # (spec but its name, upcoming) found unfit in this pass
        for i, name in enumerate(pending):
            job = state.jobs[name]
            upcoming = tuple([*waiting[:window], *pending[i + 1:i + 1 + window]][:window])
            seen = Unfit(capacity_version=state.capacity_version, upcoming=upcoming, attach_nodes=job.attach_nodes)
            shape = (_shape(job.spec), upcoming) if name_blind and not job.attach_nodes else None
            if self.remember_unfit and (self.unfit.get(name) == seen
                                        or (shape is not None and unfit_shapes.get(shape) == seen)):
                self.unfit[name] = seen
                waiting.append(name)
            elif self._admit(job, upcoming):
                self.unfit.pop(name, None)
                admitted.append(name)
            else:
                self.unfit[name] = seen = replace(seen, capacity_version=state.capacity_version)
                if shape is not None:
                    unfit_shapes[shape] = seen
                waiting.append(name)
        return admitted

    def _admit(self, job: JobRecord, upcoming: tuple[str, ...]) -> bool:
        """Admit `job` by the policy's decision, or, when its ranks attached already and that decision
        would leave one of their nodes out (I4), by its cheapest placement that covers them: a join of a
        group holding them, or a new group whose new nodes are them (`pinned_options`)."""
        free = _attach_first(self._free_for(job.spec), job.attach_nodes)
        decision = self._decide(job.spec, free, [self.state.jobs[n].spec for n in upcoming])
        tries = [decision] if decision is not None else []
        if job.attach_nodes:
            tries += [d for d in pinned_options(self.state.policy, job.spec, self.state.placement, job.attach_nodes)
                      if decision_fits(d, free)]
        group = next((g for d in tries if (g := self._place_covering(job, d, free)) is not None), None)
        if group is None:
            return False
        transition(job, JOB_TRANSITIONS, JobState.ADMITTED, now=self.state.wall(), reason=f"placed in {group.group_id}")
        self.leases.open(job)
        self.state.notify(Notice(kind=NoticeKind.JOB, job=job.name))
        self.leases.grant_waiting(self.state.phase_nodes(job, Phase.ROLLOUT))
        return True

    def _place_covering(self, job: JobRecord, decision: PlacementDecision,
                        free: dict[Pool, list[str]]) -> GroupState | None:
        """Place `job` by `decision` if its nodes then include every node its ranks attached on (I4);
        otherwise undo it and return None."""
        group = self.place(job, decision, {pool: list(nodes) for pool, nodes in free.items()})
        if set(job.attach_nodes) <= set(self.state.job_nodes(job)):
            return group
        self.unplace(job)
        job.group_id, job.rollout_nodes, job.placement = "", (), ""
        self.state.touch(f"job/{job.name}", job)
        return None

    def _decide(self, spec: JobSpec, free: dict[Pool, list[str]], upcoming: list[JobSpec]) -> PlacementDecision | None:
        """The policy's decision for `spec` (knowing the `upcoming` pending jobs behind it) if the free
        nodes host it, else a fallback that they do.

        The fleet is what it is (the live coordinator buys no node), so when the cheapest mode
        needs nodes that are not free, fall back to the disaggregated placement (the paper's),
        which may fit the nodes there are. Either try falls back to `work_aware` off (`_on_fleet`).
        Returns None when nothing fits now (the job stays pending).
        """
        decision = self._on_fleet(spec, free, upcoming)
        if not decision_fits(decision, free) and spec.deployment is None and decision.deployment is not Deployment.DISAGGREGATED:
            decision = self._on_fleet(replace(spec, deployment=Deployment.DISAGGREGATED), free, upcoming)
        return decision if decision_fits(decision, free) else None

    def _on_fleet(self, spec: JobSpec, free: dict[Pool, list[str]], upcoming: list[JobSpec]) -> PlacementDecision:
        """The policy's decision; if its new nodes are not free and the work-aware check refused a join
        (`occupancy`: the job would rather go alone on nodes the fleet does not have), the decision
        with `work_aware` off, which takes that join instead of leaving the job pending."""
        policy = self.state.policy
        decision = place_pending(policy, spec, self.state.placement, upcoming)  # knowing the jobs pending behind it
        if (not decision_fits(decision, free) and isinstance(policy, RollMuxPolicy)
                and policy.config.work_aware
                and any(r.reason is RejectReason.OCCUPANCY for r in decision.rejections)):
            decision = policy.variant(work_aware=False).place(spec, self.state.placement)
        return decision

    # ---------------------------------------------------------------------------- where it runs
    def report_attach(self, name: str, node_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Node `node_id`'s sidecar attached the first local rank of job `name` (I4: the placement is
        where the job runs). Recorded on the job; a pending job is then admitted consistently with its
        attach nodes (new nodes are taken from them first; a placement that leaves one out waits).

        Returns:
            (the nodes the job's phases run on, empty while pending; the nodes its ranks attached on).

        Raises:
            NotFoundError: unknown job or node.
            PlacementMismatchError: the job is admitted and `node_id` is none of its nodes.
        """
        state = self.state
        job = state.job(name)
        state.node(node_id)
        attach = tuple(dict.fromkeys([*job.attach_nodes, node_id]))
        placed = state.job_nodes(job) if job.state is JobState.ADMITTED else ()
        if job.state is JobState.ADMITTED and node_id not in placed:
            raise PlacementMismatchError(
                f"job {name!r} is placed on node(s) {', '.join(placed)} (group {job.group_id}) but its ranks attach "
                f"on node(s) {', '.join(attach)}: a phase never runs on a node its permit does not grant; start "
                "the job's GPU processes on its placed nodes, or deregister it and register it again from where "
                "it runs")
        if attach != job.attach_nodes:
            job.attach_nodes = attach
            state.touch(f"job/{name}", job)
        if job.state is JobState.PENDING:
            self.try_admit()
            placed = state.job_nodes(job) if job.state is JobState.ADMITTED else ()
        return placed, attach

    # ------------------------------------------------------------------------- group membership
    def place(self, job: JobRecord, decision: PlacementDecision, free: dict[Pool, list[str]] | None = None) -> GroupState:
        """Put `job` where `decision` says, taking new nodes from `free` (default: the free nodes now),
        and plan it with what is learned of it. Returns its group."""
        free = self._free_for(job.spec) if free is None else free

        def allocate(pool: Pool, count: int) -> list[str]:
            taken, free[pool] = free[pool][:count], free[pool][count:]
            return taken

        group = self.state.placement.apply(job.spec, decision, allocate=allocate)
        job.group_id, job.rollout_nodes = group.group_id, group.members[job.name].rollout_nodes
        job.deployment = decision.deployment.value  # returned at registration; adapters build workers to match
        job.placement = decision.explain()
        self._sync_group(group.group_id)
        self.state.touch(f"job/{job.name}", job)
        self.learning.joined(job.name)
        return group

    def unplace(self, job: JobRecord) -> list[str]:
        """Take `job` out of its group, passing on its turns; returns the nodes the group released."""
        self.queues.leave(job)
        released = self.state.placement.remove_job(job.name)
        self.queues.clear(released)
        self._sync_group(job.group_id)
        return released

    def _sync_group(self, gid: str) -> None:
        """Store the group as the placement holds it (its stored form only; no copy in memory)."""
        g: GroupState | None = self.state.placement.groups.get(gid)
        self.state.touch(f"group/{gid}", None if g is None else group_record(g))
        self.state.capacity_changed()

    def restore_groups(self, groups: dict[str, GroupRecord]) -> None:
        """Rebuild the placement's groups from their stored form (coordinator restart), in creation order,
        each member on the training nodes it trained on (chosen again only where the record has none)."""
        jobs = self.state.jobs
        for gid, rec in sorted(groups.items(), key=lambda kv: _gid_number(kv[0])):
            members = [(jobs[name].spec, tuple(jobs[name].rollout_nodes), Deployment(jobs[name].deployment),
                        rec.member_train_nodes.get(name, ())) for name in rec.members]
            self.state.placement.restore_group(gid, tuple(rec.train_nodes), tuple(rec.rollout_nodes), members,
                                               train_pool=Pool(rec.train_pool))

    # ----------------------------------------------------------------------------------- removal
    def remove_job(self, name: str, *, reason: str) -> list[str]:
        """Remove a job in any state; revokes its lease. Returns the nodes its group released.

        The relocation part hears of the departure from the caller (`Runtime.remove_job`)."""
        state = self.state
        job = state.job(name)
        released: list[str] = []
        self.leases.cancel(name, reason)
        group_train = state.phase_nodes(job, Phase.TRAIN)
        if job.state is JobState.ADMITTED:
            released = self.unplace(job)
        transition(job, JOB_TRANSITIONS, JobState.REMOVED, now=state.wall(), reason=reason)
        del state.jobs[name]
        self.unfit.pop(name, None)
        state.forget(f"job/{name}")
        state.notify(Notice(kind=NoticeKind.JOB, job=name, reason=reason))
        touched = set(job.rollout_nodes) | set(group_train)
        self.leases.grant_waiting(sorted(touched))
        self.try_admit()
        return released


def _shape(spec: JobSpec) -> tuple[object, ...]:
    """Every field of `spec` but its name."""
    return tuple(getattr(spec, f.name) for f in fields(spec) if f.name != "name")


def _lookahead(policy: PlacementPolicy) -> int:
    """How many pending jobs behind a job its decision looks at (`place_pending`): RollMux's lookahead."""
    return policy.config.lookahead_jobs if isinstance(policy, RollMuxPolicy) else 0


def _attach_first(free: dict[Pool, list[str]], attach: tuple[str, ...]) -> dict[Pool, list[str]]:
    """The free nodes with the job's attach nodes first: new nodes of its placement are taken from them."""
    if not attach:
        return free
    return {pool: [n for n in attach if n in nodes] + [n for n in nodes if n not in attach]
            for pool, nodes in free.items()}


def decision_fits(decision: PlacementDecision, free: dict[Pool, list[str]]) -> bool:
    """The free nodes can host the decision's new nodes (a group co-located on rollout-pool GPUs
    takes its "training" nodes from the rollout pool)."""
    need = {Pool.ROLLOUT: decision.new_rollout_nodes, Pool.TRAIN: 0}
    need[decision.train_pool] += decision.new_train_nodes
    return all(len(free[p]) >= n for p, n in need.items())


def group_record(g: GroupState) -> GroupRecord:
    """The stored form of a group: its nodes, round-robin member order and each member's training nodes."""
    return GroupRecord(group_id=g.group_id, train_nodes=tuple(g.train_nodes), rollout_nodes=tuple(g.rollout),
                       members=tuple(g.members), train_pool=g.train_pool.value,
                       member_train_nodes={name: tuple(m.train_nodes) for name, m in g.members.items()})


def _gid_number(gid: str) -> int:
    digits = "".join(ch for ch in gid if ch.isdigit())
    return int(digits) if digits else 0
