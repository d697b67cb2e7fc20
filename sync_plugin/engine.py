"""Public send/receive entry points: validate, then dispatch to the two-stage scheme or a baseline.

Call order on every rank of the world (adapters do this once, then sync every step)::

    topology = SyncTopology(trainer_ranks=(0, 1), rollout_ranks=(2, 3, 4))
    groups = create_groups(topology)                      # collective
    meta = param_metadata(model.named_parameters())       # full shapes, also on FSDP ranks
    exchange_metadata(meta, topology)                     # collective; raises before bytes move
    plan = plan_transfer(topology, meta, bucket_bytes)    # pure data, same on every rank
    send(params, plan, groups)  # trainer ranks     |     receive(buffers, plan, groups)  # rollout ranks
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollmux.sync_plugin import baselines, two_stage
from rollmux.sync_plugin.api import PlanError, Scheme, SyncError, TransferPlan
from rollmux.sync_plugin.groups import SyncGroups, device_of
from rollmux.sync_plugin.tensors import (
    LocalStream,
    byte_view,
    check_buffers,
    named_list,
    owned_parts,
)

if TYPE_CHECKING:
    import torch

DEFAULT_DEPTH = 3
"""Buckets in flight per rank. Two (double buffering) already overlaps stage 2 with stage 1; a third
keeps the cut busy while a trainer waits for its slowest flow of the oldest bucket (measured on the
netns testbed: 2 -> 8 ranks took 1.55x the bound at depth 2, 0.99x at depth 3)."""

Tensors = Any  # NamedTensors | Sequence[torch.Tensor]; Any because a Mapping is also a Sequence-like iterable
"""Full parameters or receive buffers: named (mapping or pairs) or a plain sequence in plan order."""


def send(
    params: Tensors,
    plan: TransferPlan,
    groups: SyncGroups,
    *,
    scheme: Scheme = Scheme.TWO_STAGE,
    depth: int = DEFAULT_DEPTH,
) -> None:
    """Send the weights from a trainer rank that holds full parameters.

    Under the two-stage scheme each trainer sends only the bytes it owns; under the baselines only the
    source rank sends and the other trainer ranks return at once.

    Args:
        params: full parameters in plan order.
        plan: from ``plan_transfer`` (identical on every rank).
        groups: from ``create_groups``.
        scheme: two-stage (default) or a baseline.
        depth: buckets in flight (posted but not yet completed).

    Raises:
        SyncError: this rank is not a trainer rank of the plan.
        PlanError: the tensors do not match the plan's metadata.
    """
    tensors = _tensors(params)
    check_buffers(plan.metadata, tensors, "send")
    views = [byte_view(t) for t in tensors]
    trainer = _index(plan.topology.trainer_ranks, "trainer")
    if scheme is Scheme.TWO_STAGE:
        stream = LocalStream(owned_parts(views, plan.ownership[trainer]))
        two_stage.send_stream(stream, plan, trainer, device_of(views, groups.backend), depth)
    elif trainer == 0:
        baselines.source_send(views, plan, groups, star=scheme is Scheme.STAR, depth=depth)


def send_local_shard(
    shard: Sequence[torch.Tensor], plan: TransferPlan, groups: SyncGroups, *, depth: int = DEFAULT_DEPTH
) -> None:
    """Send from a trainer rank that holds only its own shard (FSDP), without gathering the model.

    Args:
        shard: tensors whose bytes, concatenated in order, are exactly this trainer's owned spans of
            the global stream: for ``Sharding.FLAT`` its flat slice, for ``Sharding.DIM0`` the local
            dim-0 chunk of every parameter (FSDP2 ``DTensor.to_local()``), in parameter order.
        plan: from ``plan_transfer`` with the sharding the trainer uses.
        groups: from ``create_groups``.
        depth: buckets in flight.

    Raises:
        PlanError: the shard's byte count differs from what the plan says this trainer owns.
    """
    trainer = _index(plan.topology.trainer_ranks, "trainer")
    views = [byte_view(t) for t in shard]
    stream = LocalStream(views)
    expected = plan.local_bytes(trainer)
    if stream.nbytes != expected:
        raise PlanError(
            f"local shard of trainer index {trainer} has {stream.nbytes} bytes but the plan "
            f"({plan.sharding.value} sharding) assigns it {expected}; build the plan with the sharding the trainer uses"
        )
    two_stage.send_stream(stream, plan, trainer, device_of(views, groups.backend), depth)


def receive(
    param_buffers: Tensors,
    plan: TransferPlan,
    groups: SyncGroups,
    *,
    scheme: Scheme = Scheme.TWO_STAGE,
    depth: int = DEFAULT_DEPTH,
) -> None:
    """Receive a full replica into contiguous, preallocated buffers on a rollout rank.

    Args:
        param_buffers: one contiguous tensor per parameter, in plan order; overwritten bitwise.
        plan: from ``plan_transfer`` (identical on every rank).
        groups: from ``create_groups``.
        scheme: must match the trainers' scheme.
        depth: buckets whose receives are posted ahead (need not match the senders' depth).

    Raises:
        SyncError: this rank is not a rollout rank of the plan.
        PlanError: the buffers do not match the plan's metadata or are not contiguous.
    """
    tensors = _tensors(param_buffers)
    check_buffers(plan.metadata, tensors, "receive")
    views = [byte_view(t, writable=True) for t in tensors]
    rollout = _index(plan.topology.rollout_ranks, "rollout")
    if scheme is Scheme.TWO_STAGE:
        two_stage.receive_into(views, plan, groups, rollout, depth)
    else:
        baselines.source_receive(views, plan, groups, star=scheme is Scheme.STAR, depth=depth)


def _tensors(params: Tensors) -> list[torch.Tensor]:
    items: list[Any] = list(params.items()) if hasattr(params, "items") else list(params)
    if items and isinstance(items[0], tuple):
        return [t for _, t in named_list(items)]
    return items


def _index(ranks: tuple[int, ...], role: str) -> int:
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank not in ranks:
        raise SyncError(f"rank {rank} called the {role} side but the topology's {role} ranks are {ranks}")
    return ranks.index(rank)
