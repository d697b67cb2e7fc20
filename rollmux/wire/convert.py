"""Conversion between the wire's protobuf messages and `rollmux.core.model` types: the only code that
builds or reads a message's domain content, for both protocols (``rollmux.v1`` coordinator,
``rollmux.sidecar.v1`` sidecar). The coordinator's RPC edges (its clients and servicer) build request
and response envelopes of plain fields around what this module returns. For the sidecar protocol this
module builds the envelopes too: the sidecar server's answers come from the functions at its end, the
rank's requests from ``rollmux.wire.sidecar_client``; nothing past them builds a sidecar message.

Decoding validates: a missing or malformed field raises `InvalidArgumentError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollmux.core.errors import SpecError
from rollmux.core.model import (
    ClusterInfo,
    GroupInfo,
    JobInfo,
    JobSpec,
    Lease,
    Migration,
    NodeEvent,
    NodeInfo,
    NodeSnapshot,
    Phase,
    Pool,
    Relocation,
    RelocationState,
    Revocation,
)
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.wire.errors import InvalidArgumentError
from rollmux.wire.sidecar_client import Attached

POOL_TO_PB = {Pool.ROLLOUT: pb.POOL_ROLLOUT, Pool.TRAIN: pb.POOL_TRAIN}
POOL_FROM_PB = {v: k for k, v in POOL_TO_PB.items()}
PHASE_TO_PB = {Phase.ROLLOUT: pb.PHASE_ROLLOUT, Phase.TRAIN: pb.PHASE_TRAIN, Phase.SYNC: pb.PHASE_SYNC}
PHASE_FROM_PB = {v: k for k, v in PHASE_TO_PB.items()}


def pool_from_pb(value: int) -> Pool:
    try:
        return POOL_FROM_PB[value]
    except KeyError:
        raise InvalidArgumentError(f"pool={value} is invalid: expected POOL_ROLLOUT or POOL_TRAIN") from None


def phase_from_pb(value: int) -> Phase:
    try:
        return PHASE_FROM_PB[value]
    except KeyError:
        raise InvalidArgumentError(f"phase={value} is invalid: expected PHASE_ROLLOUT, PHASE_TRAIN or "
                                   "PHASE_SYNC") from None


# ---------------------------------------------------------------------------------------- job specs


def spec_from_pb(msg: pb.JobSpec) -> JobSpec:
    """A validated `JobSpec`; proto3 zero means "use the default" for the optional knobs."""
    kwargs: dict[str, object] = {"name": msg.name, "n_rollout_gpus": msg.n_rollout_gpus,
                                 "n_train_gpus": msg.n_train_gpus}
    for f in ("slo", "model_params_b", "max_tokens", "batch_size", "turns"):
        v = getattr(msg, f)
        if v:
            kwargs[f] = v
    for f in ("rollout_state_bytes", "train_state_bytes", "t_roll_s", "t_train_s"):
        if msg.HasField(f):
            kwargs[f] = getattr(msg, f)
    if msg.deployment:
        kwargs["deployment"] = msg.deployment  # validated by JobSpec (one of the Deployment values)
    if msg.elastic:
        kwargs["elastic"] = True
    try:
        return JobSpec(**kwargs)  # type: ignore[arg-type]
    except SpecError as exc:
        raise InvalidArgumentError(f"spec: {exc}") from None


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(name=spec.name, n_rollout_gpus=spec.n_rollout_gpus, n_train_gpus=spec.n_train_gpus,
                     slo=spec.slo, model_params_b=spec.model_params_b, max_tokens=spec.max_tokens,
                     batch_size=spec.batch_size, turns=spec.turns,
                     deployment="" if spec.deployment is None else spec.deployment.value, elastic=spec.elastic)
    for f in ("rollout_state_bytes", "train_state_bytes", "t_roll_s", "t_train_s"):
        v = getattr(spec, f)
        if v is not None:
            setattr(msg, f, v)
    return msg


# ------------------------------------------------------------------ permits and directives (both protocols)


def lease_to_pb(lease: Lease) -> pb.Lease:
    return pb.Lease(job=lease.job, phase=PHASE_TO_PB[lease.phase], iteration=lease.iteration, epoch=lease.epoch,
                    nodes=list(lease.nodes), ttl_s=lease.ttl_s)


def lease_from_pb(msg: pb.Lease) -> Lease:
    return Lease(job=msg.job, phase=phase_from_pb(msg.phase), iteration=msg.iteration, epoch=msg.epoch,
                 nodes=tuple(msg.nodes), ttl_s=msg.ttl_s)


def migration_to_pb(m: Migration) -> pb.MigrationDirective:
    return pb.MigrationDirective(job=m.job, epoch=m.epoch, keep_nodes=list(m.keep_nodes),
                                 release_nodes=list(m.release_nodes))


def migration_from_pb(msg: pb.MigrationDirective) -> Migration:
    return Migration(job=msg.job, epoch=msg.epoch, keep_nodes=tuple(msg.keep_nodes),
                     release_nodes=tuple(msg.release_nodes))


def revocation_to_pb(r: Revocation) -> pb.PermitRevoked:
    return pb.PermitRevoked(job=r.job, epoch=r.epoch, reason=r.reason)


def revocation_from_pb(msg: pb.PermitRevoked) -> Revocation:
    return Revocation(job=msg.job, epoch=msg.epoch, reason=msg.reason)


def relocation_to_pb(r: Relocation) -> pb.RelocationDirective:
    return pb.RelocationDirective(job=r.job, from_group=r.from_group, to_group=r.to_group, epoch=r.epoch,
                                  deadline_unix_s=r.deadline_unix_s, state=r.state.value,
                                  rollout_nodes=list(r.rollout_nodes), train_nodes=list(r.train_nodes),
                                  switched_epoch=r.switched_epoch, reason=r.reason)


def relocation_from_pb(msg: pb.RelocationDirective) -> Relocation:
    """Decode a directive (the coordinator's own answer: an unknown state reads as expired)."""
    try:
        state = RelocationState(msg.state)
    except ValueError:
        state = RelocationState.EXPIRED
    return Relocation(job=msg.job, from_group=msg.from_group, to_group=msg.to_group, epoch=msg.epoch,
                      deadline_unix_s=msg.deadline_unix_s, state=state, rollout_nodes=tuple(msg.rollout_nodes),
                      train_nodes=tuple(msg.train_nodes), switched_epoch=msg.switched_epoch, reason=msg.reason)


# -------------------------------------------------------------------------------- the node stream


def node_event_to_pb(event: NodeEvent) -> pb.NodeDown:
    """One message of a node's stream."""
    if isinstance(event, NodeSnapshot):
        snap = pb.NodeSnapshot(node_id=event.node_id, state=event.state)
        if event.holder is not None:
            snap.holder.CopyFrom(lease_to_pb(event.holder))
        return pb.NodeDown(snapshot=snap)
    return pb.NodeDown(**_directive_to_pb(event, pb.PermitGranted))


def _directive_to_pb(event: Lease | Revocation | Migration | Relocation, granted: Any) -> dict[str, Any]:
    """The oneof field of a directive, shared by the node and rank streams (they differ only in the
    message wrapping a grant: `granted`)."""
    if isinstance(event, Lease):
        return {"granted": granted(lease=lease_to_pb(event))}
    if isinstance(event, Revocation):
        return {"revoked": revocation_to_pb(event)}
    if isinstance(event, Migration):
        return {"migrate": migration_to_pb(event)}
    return {"relocate": relocation_to_pb(event)}


def node_event_from_pb(msg: pb.NodeDown) -> NodeEvent | None:
    """The event a node's stream message carries (None: a kind this release does not know)."""
    if msg.WhichOneof("kind") == "snapshot":
        s = msg.snapshot
        return NodeSnapshot(node_id=s.node_id, state=s.state,
                            holder=lease_from_pb(s.holder) if s.HasField("holder") else None)
    return _directive_from_pb(msg)


def _directive_from_pb(msg: pb.NodeDown | spb.RankEvent) -> Lease | Revocation | Migration | Relocation | None:
    """The lease, revocation or directive a node-stream or rank-stream message carries (their oneofs
    share these four kinds and field names)."""
    kind = msg.WhichOneof("kind")
    if kind == "granted":
        return lease_from_pb(msg.granted.lease)
    if kind == "revoked":
        return revocation_from_pb(msg.revoked)
    if kind == "migrate":
        return migration_from_pb(msg.migrate)
    if kind == "relocate":
        return relocation_from_pb(msg.relocate)
    return None


# ------------------------------------------------------------------------------------------ views


def job_info_to_pb(info: JobInfo) -> pb.JobStatus:
    msg = pb.JobStatus(job=info.job, state=info.state, group_id=info.group_id, rollout_nodes=info.rollout_nodes,
                       train_nodes=info.train_nodes, next_phase=PHASE_TO_PB[info.next_phase],
                       next_iteration=info.next_iteration, permit_state=info.permit_state,
                       observed_roll_s=info.observed_roll_s, observed_train_s=info.observed_train_s,
                       pending_position=info.pending_position, placement=info.placement,
                       relayed_by=info.relayed_by, learned_roll_s=info.learned[0], learned_train_s=info.learned[1],
                       learned_solo_s=info.learned[2], deployment=info.deployment)
    if info.lease is not None:
        msg.lease.CopyFrom(lease_to_pb(info.lease))
    if info.relocation is not None:
        msg.relocation.CopyFrom(relocation_to_pb(info.relocation))
    return msg


def job_info_from_pb(msg: pb.JobStatus) -> JobInfo:
    return JobInfo(job=msg.job, state=msg.state, group_id=msg.group_id, rollout_nodes=tuple(msg.rollout_nodes),
                   train_nodes=tuple(msg.train_nodes), next_phase=phase_from_pb(msg.next_phase),
                   next_iteration=msg.next_iteration, permit_state=msg.permit_state,
                   pending_position=msg.pending_position,
                   relocation=relocation_from_pb(msg.relocation) if msg.HasField("relocation") else None,
                   learned=(msg.learned_roll_s, msg.learned_train_s, msg.learned_solo_s),
                   lease=lease_from_pb(msg.lease) if msg.HasField("lease") else None,
                   observed_roll_s=msg.observed_roll_s, observed_train_s=msg.observed_train_s,
                   placement=msg.placement, relayed_by=msg.relayed_by, deployment=msg.deployment)


def cluster_info_to_pb(info: ClusterInfo) -> pb.ClusterStateResponse:
    resp = pb.ClusterStateResponse(ready=info.ready, leader_fence=info.leader_fence, pending=info.pending,
                                   usd_per_h=info.usd_per_h)
    for n in info.nodes:
        node = pb.NodeInfo(node_id=n.node_id, pool=POOL_TO_PB[n.pool], gpu_type=n.gpu_type, gpu_count=n.gpu_count,
                           host_dram_bytes=n.host_dram_bytes, state=n.state, group_id=n.group_id, queue=n.queue,
                           connected=n.connected)
        if n.holder is not None:
            node.holder.CopyFrom(lease_to_pb(n.holder))
        resp.nodes.append(node)
    for g in info.groups:
        resp.groups.append(pb.GroupInfo(group_id=g.group_id, jobs=g.jobs, rollout_nodes=g.rollout_nodes,
                                        train_nodes=g.train_nodes, usd_per_h=g.usd_per_h))
    resp.jobs.extend(job_info_to_pb(j) for j in info.jobs)
    return resp


def cluster_info_to_dict(info: ClusterInfo) -> dict[str, object]:
    """The protobuf JSON mapping of `info` (``rollmux status --json``, the chaos harness's snapshots)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(cluster_info_to_pb(info), preserving_proto_field_name=True)


def cluster_info_from_pb(msg: pb.ClusterStateResponse) -> ClusterInfo:
    nodes = tuple(NodeInfo(node_id=n.node_id, pool=pool_from_pb(n.pool), gpu_type=n.gpu_type, gpu_count=n.gpu_count,
                           host_dram_bytes=n.host_dram_bytes, state=n.state, group_id=n.group_id,
                           queue=tuple(n.queue), holder=lease_from_pb(n.holder) if n.HasField("holder") else None,
                           connected=n.connected) for n in msg.nodes)
    groups = tuple(GroupInfo(group_id=g.group_id, jobs=tuple(g.jobs), rollout_nodes=tuple(g.rollout_nodes),
                             train_nodes=tuple(g.train_nodes), usd_per_h=g.usd_per_h) for g in msg.groups)
    return ClusterInfo(ready=msg.ready, leader_fence=msg.leader_fence, pending=tuple(msg.pending),
                       usd_per_h=msg.usd_per_h, nodes=nodes, groups=groups,
                       jobs=tuple(job_info_from_pb(j) for j in msg.jobs))


# ------------------------------------------------------------------------- the sidecar's rank events


def rank_event_to_pb(event: Lease | Revocation | Migration | Relocation) -> spb.RankEvent:
    """One message of a rank's ``Attach`` stream (after its first, ``attached``)."""
    return spb.RankEvent(**_directive_to_pb(event, spb.Granted))


def rank_event_from_pb(msg: spb.RankEvent) -> Lease | Revocation | Migration | Relocation | None:
    """The event a rank's stream message carries (None: ``attached``, or a kind this release does not know)."""
    return _directive_from_pb(msg)


def attached_to_pb(attached: Attached) -> spb.RankEvent:
    """The first message of a rank's ``Attach`` stream: its lease id and the node it holds it on."""
    return spb.RankEvent(attached=spb.Attached(rank_id=attached.rank_id, node_id=attached.node_id,
                                               pool=attached.pool))


def attached_from_pb(msg: spb.RankEvent) -> Attached:
    return Attached(rank_id=msg.attached.rank_id, node_id=msg.attached.node_id, pool=msg.attached.pool)


# ------------------------------------------------------------------------- the sidecar's answers


def acquire_response_to_pb(lease: Lease, waited_s: float) -> spb.AcquireResponse:
    return spb.AcquireResponse(lease=lease_to_pb(lease), waited_s=waited_s)


def release_response_to_pb(node_released: bool, next_phase: Phase | None, next_iteration: int
                            ) -> spb.ReleaseResponse:
    """`next_phase` None: this call did not release the node (PHASE_UNSPECIFIED on the wire)."""
    return spb.ReleaseResponse(node_released=node_released, next_iteration=next_iteration,
                               next_phase=pb.PHASE_UNSPECIFIED if next_phase is None else PHASE_TO_PB[next_phase])


def progress_response_to_pb(migration: Migration | None) -> spb.ProgressResponse:
    """The answer to a progress report: the long-tail migration directive, when the coordinator sent one."""
    resp = spb.ProgressResponse()
    if migration is not None:
        resp.migrate.CopyFrom(migration_to_pb(migration))
    return resp


def relocate_response_to_pb(directive: Relocation, note: str) -> spb.RelocateResponse:
    return spb.RelocateResponse(directive=relocation_to_pb(directive), note=note)


def detach_response_to_pb() -> spb.DetachResponse:
    return spb.DetachResponse()


def node_status_to_pb(status: Mapping[str, Any]) -> spb.NodeStatusResponse:
    """The node agent's status (``NodeAgent.status``: node_id, pool, connection, ranks,
    cached_state_host_bytes, events)."""
    return spb.NodeStatusResponse(node_id=status["node_id"], pool=status["pool"], connection=status["connection"],
                                  ranks=status["ranks"], cached_state_host_bytes=status["cached_state_host_bytes"],
                                  events=status["events"])


def register_response_to_pb(job: str, token: str, deployment: str | None, state: str) -> spb.RegisterResponse:
    """A relayed registration's answer (`deployment` None: not decided; `state`: the JobState value)."""
    return spb.RegisterResponse(job=job, job_token=token, deployment=deployment or "", state=state)
