"""What the coordinator's readers see of the runtime: job status, the cluster view, a node's events, wait reasons.

Reads the parts' fields directly (`Runtime.state`, `.leases`, `.liveness`, `.grant_queues`,
`.directives`) and changes nothing, so the `Runtime` facade keeps only the sequencing of events between
its parts. The servicer answers its read RPCs and the node streams from here.
"""

from __future__ import annotations

from rollmux.coordinator.policy.grants import Ring, current_turn
from rollmux.coordinator.service.runtime.api import JobState, PermitState
from rollmux.coordinator.service.runtime.facade import Runtime
from rollmux.coordinator.service.runtime.records import JobRecord, NodeRecord, PermitRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.runtime.states import PERMIT_PARKED
from rollmux.core.model import (
    ClusterInfo,
    GroupInfo,
    JobInfo,
    Migration,
    NodeEvent,
    NodeInfo,
    NodeSnapshot,
    Phase,
    Revocation,
)


def job(rt: Runtime, name: str) -> JobRecord | None:
    """Job `name`'s record (None: no such job)."""
    return rt.state.jobs.get(name)


def permit(rt: Runtime, name: str) -> PermitRecord | None:
    """Job `name`'s current permit (None: not admitted yet, or no such job)."""
    return rt.state.permits.get(name)


def node(rt: Runtime, node_id: str) -> NodeRecord:
    """Node `node_id`'s record.

    Raises:
        NotFoundError: the node never registered.
    """
    return rt.state.node(node_id)


def has_node(rt: Runtime, node_id: str) -> bool:
    return node_id in rt.state.nodes


def heartbeat_changes_state(rt: Runtime, node_id: str) -> bool:
    """Whether a heartbeat from `node_id` now changes a stored record (LOST -> READY): then it is a transition."""
    return rt.liveness.heartbeat_changes_state(node_id)


def job_status(rt: Runtime, name: str, ttl_s: float | None = None) -> JobInfo:
    """Job `name` as the coordinator sees it now (GetJob, RegisterJob, GetClusterState)."""
    state = rt.state
    record = state.job(name)
    ttl = state.config.lease_ttl_s if ttl_s is None else ttl_s
    held = state.permits.get(name)
    rec = rt.directives.relocations.get(name)
    group = state.placement.groups.get(record.group_id)
    member = group.members.get(name) if group is not None else None
    learned = (0.0, 0.0, 0.0)
    if member is not None and member.profile.learned:
        p = member.profile
        learned = (p.t_roll_s, p.t_train_s, p.t_solo_s)
    return JobInfo(
        job=name, state=record.state.value, group_id=record.group_id,
        rollout_nodes=tuple(state.phase_nodes(record, Phase.ROLLOUT)),
        train_nodes=tuple(state.phase_nodes(record, Phase.TRAIN)),
        placement=record.placement, relayed_by=record.relayed_by,
        next_phase=Phase.ROLLOUT if held is None else held.phase,
        next_iteration=0 if held is None else held.iteration,
        permit_state="pending-admission" if held is None else held.state.value,
        observed_roll_s=0.0 if held is None else held.observed_roll_s,
        observed_train_s=0.0 if held is None else held.observed_train_s,
        lease=held.to_lease(ttl) if held is not None and held.state is PermitState.GRANTED else None,
        pending_position=state.pending().index(name) + 1 if record.state is JobState.PENDING else 0,
        relocation=None if rec is None else rec.to_model(), learned=learned,
        deployment=record.deployment if record.state is JobState.ADMITTED or record.spec.deployment is not None
        else "")


def cluster_state(rt: Runtime, *, ready: bool, fence: int, ttl_s: float) -> ClusterInfo:
    """The coordinator's whole state (GetClusterState)."""
    state, holder = rt.state, rt.leases.holder
    node_group = state.placement.node_group
    queues = rt.grant_queues.queues
    nodes = []
    for n in sorted(state.nodes.values(), key=lambda n: (n.pool.value, n.node_id)):
        held_by = holder.get(n.node_id)
        nodes.append(NodeInfo(node_id=n.node_id, pool=n.pool, gpu_type=n.gpu_type, gpu_count=n.gpu_count,
                              host_dram_bytes=n.host_dram_bytes, state=n.state.value,
                              group_id=node_group.get(n.node_id, ""), queue=tuple(queues.get(n.node_id, [])),
                              holder=None if held_by is None else state.permits[held_by].to_lease(ttl_s),
                              connected=n.node_id in rt.liveness.connected))
    groups = tuple(GroupInfo(group_id=gid, jobs=tuple(g.members), rollout_nodes=tuple(g.rollout),
                             train_nodes=tuple(g.train_nodes), usd_per_h=g.usd_per_h)
                   for gid, g in state.placement.groups.items())
    jobs = state.jobs
    return ClusterInfo(ready=ready, leader_fence=fence, pending=tuple(state.pending()),
                       usd_per_h=state.placement.usd_per_h, nodes=tuple(nodes), groups=groups,
                       jobs=tuple(job_status(rt, name, ttl_s) for name in sorted(jobs, key=lambda n: jobs[n].seq)))


def node_event(rt: Runtime, node_id: str, notice: Notice) -> NodeEvent | None:
    """What node `node_id`'s sidecar hears of `notice` (None: it is out of date, or not for the stream)."""
    state = rt.state
    ttl = state.config.lease_ttl_s
    if notice.kind is NoticeKind.NODE:
        n = state.nodes.get(node_id)
        if n is None:
            return None
        held_by = rt.leases.holder.get(node_id)
        return NodeSnapshot(node_id=node_id, state=n.state.value,
                            holder=None if held_by is None else state.permits[held_by].to_lease(ttl))
    if notice.kind is NoticeKind.GRANTED:
        held = state.permits.get(notice.job)
        if held is None or held.epoch != notice.epoch:
            return None
        return held.to_lease(ttl)
    if notice.kind is NoticeKind.REVOKED:
        return Revocation(job=notice.job, epoch=notice.epoch, reason=notice.reason)
    if notice.kind is NoticeKind.RELOCATE:
        rec = rt.directives.relocations.get(notice.job)
        if rec is None or rec.epoch != notice.epoch:
            return None
        return rec.to_model()
    if notice.kind is NoticeKind.MIGRATE:
        return Migration(job=notice.job, epoch=notice.epoch, keep_nodes=tuple(notice.keep_nodes),
                         release_nodes=tuple(notice.release_nodes))
    return None


def wait_reason(rt: Runtime, name: str) -> str:
    """Why a job's permit is not granted yet, naming the blocker."""
    state = rt.state
    record = state.job(name)
    if record.state is JobState.PENDING and record.attach_nodes:
        pos = state.pending().index(name) + 1
        return (f"job {name!r} is pending admission (position {pos}): its ranks attached on node(s) "
                f"{', '.join(record.attach_nodes)} and no placement including them fits the free nodes yet")
    if record.state is JobState.PENDING:
        pos = state.pending().index(name) + 1
        return (f"job {name!r} is pending admission (position {pos}): the free nodes cannot host its "
                "placement yet")
    held = state.permits.get(name)
    if held is None:
        return f"job {name!r} has no permit yet"
    if held.state in PERMIT_PARKED:
        return f"job {name!r} {held.phase.value}({held.iteration}) lease {held.state.value}"
    what = f"{held.phase.value}({held.iteration})"
    rings = rt.grant_queues.rings(record.group_id) if held.state is PermitState.QUEUED else {}
    for n in state.phase_nodes(record, held.phase):
        blocker = _blocker(rt, name, n, rings.get(n))
        if blocker is not None:
            return f"{what} {blocker}"
    return f"{what} {held.state.value}"


def _blocker(rt: Runtime, name: str, node_id: str, ring: Ring | None) -> str | None:
    """What on `node_id` keeps job `name` waiting (its turn, a holder, the node), or None."""
    turn = None if ring is None else current_turn(ring, rt.leases.parked())
    if turn is not None and turn != name:
        return (f"waits for its round-robin turn on node {node_id}: queued behind job {turn!r} "
                f"(turn order {', '.join(ring.order)})")  # type: ignore[union-attr]
    holder = rt.leases.holder
    if node_id in holder and holder[node_id] != name:
        return f"waits for node {node_id} held by job {holder[node_id]!r}"
    if node_id not in holder and not rt.liveness.usable(node_id):
        return f"waits for node {node_id} ({rt.state.nodes[node_id].state.value}, " \
               f"{'connected' if node_id in rt.liveness.connected else 'sidecar not connected'})"
    return None


__all__ = ["cluster_state", "has_node", "heartbeat_changes_state", "job", "job_status", "node", "node_event", "permit", "wait_reason"]
