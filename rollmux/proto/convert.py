"""Conversion between `rollmux.v1` messages and domain types; protobuf stays at this edge.

Decoding validates: a missing or malformed field raises `InvalidArgumentError` naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollmux.coordinator.service.api import InvalidArgumentError
from rollmux.errors import SpecError
from rollmux.model import JobSpec, Phase, Pool, Relocation, RelocationState
from rollmux.proto import rollmux_v1_pb2 as pb

if TYPE_CHECKING:
    from rollmux.coordinator.service.records import PermitRecord

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


def lease_to_pb(permit: PermitRecord, ttl_s: float) -> pb.Lease:
    return pb.Lease(job=permit.job, phase=PHASE_TO_PB[permit.phase], iteration=permit.iteration,
                    epoch=permit.epoch, nodes=list(permit.nodes), ttl_s=ttl_s)


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
