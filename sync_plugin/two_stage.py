"""Two-stage weight sync: stage 1 scatters disjoint shards across the cut, stage 2 all-gathers them.

A rollout rank drives two communicators: stage 1's point-to-point receives on the world group and
stage 2's all-gather on the rollout-only group. The order of their operations is data
(:func:`receive_schedule`), and one of two disciplines applies:

* **gloo (overlapped)**: the receives of the next ``depth`` buckets stay posted while bucket k is
  gathered, so stage 2 of bucket k overlaps stage 1 of bucket k+1 (gloo progresses each group on its
  own threads, and a blocked operation of one group never stops the other's).
* **NCCL (ordered)**: at most one communicator has work outstanding at any time. NCCL does not
  guarantee progress for kernels of two communicators that run concurrently on one device (each can
  occupy the GPU while waiting for peers that wait for the other), so a bucket's receives complete
  before its all-gather starts, and the all-gather completes before the next bucket's receives are
  posted. "Complete" is a stream order, not a host wait: ``work.wait()`` makes the current CUDA stream
  wait for the communicator's stream, and the next operation's stream waits for the current one. Every
  rollout rank follows the same schedule, so the order is the same on all of them. The overlap is lost
  on the rollout side; the trainers still keep ``depth`` buckets of sends in flight.

Unpacking into parameters runs one bucket behind (gloo) or right after the gather (NCCL), on its own
CUDA stream on GPUs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from enum import Enum
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


class Step(str, Enum):
    """One operation of a rollout rank's receive schedule (see :func:`receive_schedule`)."""

    RECV = "recv"  # post bucket k's stage-1 receives (world group)
    WAIT_RECV = "wait_recv"  # wait for them
    GATHER = "gather"  # start bucket k's stage-2 all-gather (rollout group)
    WAIT_GATHER = "wait_gather"  # wait for it
    UNPACK = "unpack"  # copy the gathered bucket into the parameters (waits for the gather itself)


def ordered_communicators(backend: str) -> bool:
    """Whether stage 1 and stage 2 must not have work outstanding at the same time (NCCL: yes)."""
    return backend == "nccl"


def receive_schedule(n_buckets: int, depth: int, *, ordered: bool) -> list[tuple[Step, int]]:
    """The order of a rollout rank's operations over ``n_buckets`` buckets. Pure.

    Args:
        n_buckets: buckets of the plan.
        depth: stage-1 buckets kept posted ahead of the bucket being gathered (overlapped mode).
        ordered: one communicator at a time (NCCL), else overlapped (gloo).

    Returns:
        (step, bucket) pairs; every bucket gets each step exactly once, RECV before WAIT_RECV before
        GATHER before UNPACK.
    """
    out: list[tuple[Step, int]] = []
    if ordered:
        for k in range(n_buckets):
            out += [(Step.RECV, k), (Step.WAIT_RECV, k), (Step.GATHER, k), (Step.WAIT_GATHER, k), (Step.UNPACK, k)]
        return out
    depth = max(1, depth)
    out += [(Step.RECV, k) for k in range(min(depth, n_buckets))]
    for k in range(n_buckets):
        if k + depth < n_buckets:
            out.append((Step.RECV, k + depth))
        out += [(Step.WAIT_RECV, k), (Step.GATHER, k)]
        if k > 0:
            out.append((Step.UNPACK, k - 1))
    if n_buckets:
        out.append((Step.UNPACK, n_buckets - 1))
    return out


def receive_into(
    views: Sequence[torch.Tensor], plan: TransferPlan, groups: SyncGroups, rollout: int, depth: int = 2
) -> None:
    """Stages 1 and 2 on a rollout rank: receive my pieces, all-gather, unpack into parameter bytes.

    Args:
        views: writable ``uint8`` views of the receive buffers, in plan order.
        plan: the two-stage plan.
        groups: communicators (stage 2 uses ``groups.rollout``).
        rollout: this rank's index into ``plan.topology.rollout_ranks``.
        depth: stage-1 buckets kept posted ahead of the bucket being gathered (gloo only).
    """
    device = device_of(views, groups.backend)
    buckets = plan.buckets
    schedule = receive_schedule(len(buckets), depth, ordered=ordered_communicators(groups.backend))
    recvs: dict[int, tuple[torch.Tensor, list[Any]]] = {}
    gathers: dict[int, tuple[torch.Tensor, Any]] = {}
    unpacker = _Unpacker(device)
    for step, k in schedule:
        if step is Step.RECV:
            recvs[k] = _post_recv(buckets[k], plan, rollout, device)
        elif step is Step.WAIT_RECV:
            wait_all(recvs[k][1])
        elif step is Step.GATHER:
            gathers[k] = _all_gather(recvs.pop(k)[0], groups)
        elif step is Step.WAIT_GATHER:
            out, work = gathers[k]
            if work is not None:
                work.wait()
            gathers[k] = (out, None)
        else:
            unpacker.finish(buckets[k], *gathers.pop(k), views)
    unpacker.close()


def _post_recv(
    b: BucketPlan, plan: TransferPlan, rollout: int, device: torch.device
) -> tuple[torch.Tensor, list[Any]]:
    import torch

    piece = torch.empty(b.piece_bytes, dtype=torch.uint8, device=device)
    trainer_ranks = plan.topology.trainer_ranks
    ops = [
        ("recv", piece[t.dst_offset : t.dst_offset + t.length], trainer_ranks[t.trainer], b.index)
        for t in b.transfers
        if t.rollout == rollout
    ]
    return piece, post(ops)


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
        self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))  # receives waited there
        with torch.cuda.stream(self._stream):
            if work is not None:
                work.wait()  # makes the side stream wait for the collective
            unpack(out, b.placements, views)
            out.record_stream(self._stream)

    def close(self) -> None:
        import torch

        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
