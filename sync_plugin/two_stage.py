"""Two-stage weight sync: stage 1 scatters disjoint shards across the cut, stage 2 all-gathers them.

Pipelining: a rollout rank keeps the stage-1 receives of the next ``depth`` buckets posted while the
stage-2 all-gather of the current bucket runs on the rollout-only group, so stage 2 of bucket k
overlaps stage 1 of bucket k+1 (two communicators progress independently, on gloo threads or on
NCCL streams). Unpacking into parameters runs one bucket behind, on its own CUDA stream on GPUs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollmux.sync_plugin.api import BucketPlan, TransferPlan
from rollmux.sync_plugin.groups import SyncGroups, device_of, post, wait_all
from rollmux.sync_plugin.tensors import LocalStream, unpack

if TYPE_CHECKING:
    import torch


def send_stream(
    stream: LocalStream, plan: TransferPlan, trainer: int, device: torch.device, depth: int = 2
) -> None:
    """Stage 1 on a trainer rank: send each bucket's chunk of its local stream to the rollout ranks.

    Args:
        stream: the trainer's owned bytes (full-parameter slices or its FSDP local shard).
        plan: the two-stage plan.
        trainer: this rank's index into ``plan.topology.trainer_ranks``.
        device: where staging buffers live (the weights' device).
        depth: buckets in flight before the oldest is waited for (double buffering at 2).
    """
    import torch

    rollout_ranks = plan.topology.rollout_ranks
    in_flight: deque[tuple[torch.Tensor, list[Any]]] = deque()
    for b in plan.buckets:
        chunk = b.chunks[trainer]
        if chunk.length == 0:
            continue
        staging = torch.empty(chunk.length, dtype=torch.uint8, device=device)
        stream.read_into(chunk, staging)
        ops = [
            (
                "send",
                staging[t.src_offset - chunk.start : t.src_offset - chunk.start + t.length],
                rollout_ranks[t.rollout],
                b.index,
            )
            for t in b.transfers
            if t.trainer == trainer
        ]
        in_flight.append((staging, post(ops)))
        while len(in_flight) > depth:
            wait_all(in_flight.popleft()[1])
    while in_flight:
        wait_all(in_flight.popleft()[1])


def receive_into(
    views: Sequence[torch.Tensor], plan: TransferPlan, groups: SyncGroups, rollout: int, depth: int = 2
) -> None:
    """Stages 1 and 2 on a rollout rank: receive my pieces, all-gather, unpack into parameter bytes.

    Args:
        views: writable ``uint8`` views of the receive buffers, in plan order.
        plan: the two-stage plan.
        groups: communicators (stage 2 uses ``groups.rollout``).
        rollout: this rank's index into ``plan.topology.rollout_ranks``.
        depth: stage-1 buckets kept posted ahead of the bucket being gathered.
    """
    device = device_of(views, groups.backend)
    buckets = plan.buckets
    recvs = deque(_post_recv(b, plan, rollout, device) for b in buckets[:depth])
    gathers: deque[tuple[BucketPlan, torch.Tensor, Any, torch.Tensor]] = deque()
    unpacker = _Unpacker(device)
    for k in range(len(buckets)):
        b, piece, works = recvs.popleft()
        if k + depth < len(buckets):
            recvs.append(_post_recv(buckets[k + depth], plan, rollout, device))
        wait_all(works)
        out, work = _all_gather(piece, groups)
        gathers.append((b, out, work, piece))
        if len(gathers) > 1:
            unpacker.finish(*gathers.popleft()[:3], views)
    while gathers:
        unpacker.finish(*gathers.popleft()[:3], views)
    unpacker.close()


def _post_recv(
    b: BucketPlan, plan: TransferPlan, rollout: int, device: torch.device
) -> tuple[BucketPlan, torch.Tensor, list[Any]]:
    import torch

    piece = torch.empty(b.piece_bytes, dtype=torch.uint8, device=device)
    trainer_ranks = plan.topology.trainer_ranks
    ops = [
        ("recv", piece[t.dst_offset : t.dst_offset + t.length], trainer_ranks[t.trainer], b.index)
        for t in b.transfers
        if t.rollout == rollout
    ]
    return b, piece, post(ops)


def _all_gather(piece: torch.Tensor, groups: SyncGroups) -> tuple[torch.Tensor, Any]:
    """Start the stage-2 all-gather of one bucket; returns (gathered buffer in piece order, work or None)."""
    import torch
    import torch.distributed as dist

    order = groups.gather_order
    if len(order) == 1:
        return piece, None
    n = piece.numel()
    out = torch.empty(n * len(order), dtype=torch.uint8, device=piece.device)
    if order == tuple(range(len(order))):
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return out, gather(out, piece, group=groups.rollout, async_op=True)
    # Group rank i holds the piece of rollout index order[i]: gather straight into that slot.
    slots = [out[j * n : (j + 1) * n] for j in order]
    return out, dist.all_gather(slots, piece, group=groups.rollout, async_op=True)


class _Unpacker:
    """Copies gathered buckets into parameters; on CUDA on a side stream so the next bucket's
    communication is never queued behind the copies."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if self._cuda else None

    def finish(self, b: BucketPlan, out: torch.Tensor, work: Any, views: Sequence[torch.Tensor]) -> None:
        import torch

        if not self._cuda:
            if work is not None:
                work.wait()
            unpack(out, b.placements, views)
            return
        assert self._stream is not None
        with torch.cuda.stream(self._stream):
            if work is not None:
                work.wait()  # makes the side stream wait for the collective
            unpack(out, b.placements, views)
            out.record_stream(self._stream)

    def close(self) -> None:
        import torch

        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
