"""Process groups, point-to-point helpers and the metadata exchange (torch.distributed, imported lazily).

``create_groups`` and ``exchange_metadata`` are collectives over the default process group: every
rank of the world calls them, in the same order, including ranks that take no part in the sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollmux.sync_plugin.api import MetadataMismatchError, ParamMeta, SyncTopology, metadata_digest

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroups:
    """Communicators of one topology, created once and reused every sync (no teardown between phases)."""

    topology: SyncTopology
    """Ranks involved."""
    backend: str
    """Backend of the default group: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors)."""
    rollout: Any
    """Rollout-only group: stage 2 all-gathers over the intra-cluster fabric."""
    spanning: Any
    """Trainer rank 0 plus every rollout rank: the single-source broadcast baseline."""
    gather_order: tuple[int, ...]
    """Rollout index (position in ``rollout_ranks``) of each rank of ``rollout``, in group-rank order;
    ``new_group`` orders members by global rank, whatever order the topology lists them in."""


def create_groups(topology: SyncTopology) -> SyncGroups:
    """Create the rollout-only and spanning groups. Every rank of the world must call this.

    Args:
        topology: trainer and rollout ranks.

    Returns:
        The groups; on ranks outside a group its handle is a non-member placeholder.

    Raises:
        TopologyError: a rank of the topology is not in the default process group.
    """
    import torch.distributed as dist

    topology.check_world(dist.get_world_size())
    rollout = dist.new_group(list(topology.rollout_ranks))
    spanning = dist.new_group([topology.source_rank, *topology.rollout_ranks])
    members = sorted(topology.rollout_ranks)
    if dist.get_rank() in topology.rollout_ranks:
        members = list(dist.get_process_group_ranks(rollout))
    return SyncGroups(
        topology=topology,
        backend=str(dist.get_backend()),
        rollout=rollout,
        spanning=spanning,
        gather_order=tuple(topology.rollout_ranks.index(r) for r in members),
    )


def exchange_metadata(metadata: Sequence[ParamMeta] | None, topology: SyncTopology) -> None:
    """Check, before any weight moves, that every trainer and rollout rank has the same parameter list.

    Digests are all-gathered first; only on a mismatch are the full lists gathered to name the first
    differing parameter. Every rank raises the same error, so no rank is left waiting in a transfer.
    Under NCCL, call ``torch.cuda.set_device`` first (object collectives go through the current GPU).

    Args:
        metadata: this rank's parameter list (full shapes), or None on a rank outside the topology.
        topology: trainer and rollout ranks.

    Raises:
        MetadataMismatchError: names the ranks and the first parameter that differ.
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    topology.check_world(world)
    mine = None if metadata is None else (metadata_digest(tuple(metadata)), len(metadata))
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, mine)
    ref = topology.source_rank
    bad = [r for r in (*topology.trainer_ranks, *topology.rollout_ranks) if digests[r] != digests[ref]]
    if not bad:
        return
    lists: list[Any] = [None] * world
    dist.all_gather_object(lists, None if metadata is None else tuple(metadata))
    raise MetadataMismatchError(_explain(lists, topology, ref, bad))


def _explain(lists: list[Any], topology: SyncTopology, ref: int, bad: list[int]) -> str:
    r = bad[0]
    a, b = lists[ref] or (), lists[r] or ()
    where = f"{topology.role(r)} rank {r} vs trainer rank {ref}"
    head = f"parameter lists differ on ranks {bad} ({where}): "
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return head + f"parameter #{i} is {y.describe()} on rank {r} but {x.describe()} on rank {ref}"
    if len(a) != len(b):
        return head + f"rank {r} has {len(b)} parameters, rank {ref} has {len(a)}"
    return head + "digests differ"


def post(ops: list[tuple[str, torch.Tensor, int, int]]) -> list[Any]:
    """Post point-to-point ops on the default group; returns their work handles.

    Args:
        ops: (``"send"`` | ``"recv"``, tensor, peer global rank, tag).

    NCCL needs ops batched (``batch_isend_irecv``) so that a rank's sends and receives to several peers
    cannot deadlock; gloo takes them one by one, with tags to keep buckets apart.
    """
    import torch.distributed as dist

    if not ops:
        return []
    if dist.get_backend() == "nccl":
        p2p = [
            dist.P2POp(dist.isend if k == "send" else dist.irecv, t, peer, tag=tag) for k, t, peer, tag in ops
        ]
        return list(dist.batch_isend_irecv(p2p))
    return [(dist.isend if k == "send" else dist.irecv)(t, peer, tag=tag) for k, t, peer, tag in ops]


def wait_all(works: Sequence[Any]) -> None:
    """Wait for every work handle."""
    for w in works:
        w.wait()


def device_of(tensors: Sequence[torch.Tensor], backend: str) -> torch.device:
    """Device for staging buffers: the tensors' device, or the current CUDA device under NCCL."""
    import torch

    if tensors:
        return tensors[0].device
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
