"""Single-source baselines run by the same harness: star fan-out and one spanning broadcast.

Both ship the full model from trainer rank 0 (``topology.source_rank``), as veRL's and ROLL's
disaggregated paths do; they are bucketed and pipelined like the two-stage scheme so the comparison
isolates the routing, not per-tensor overheads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollmux.sync_plugin.api import BucketPlan, Span, TransferPlan
from rollmux.sync_plugin.groups import SyncGroups, device_of, post, wait_all
from rollmux.sync_plugin.plan import plan_full_buckets
from rollmux.sync_plugin.tensors import LocalStream, unpack

if TYPE_CHECKING:
    import torch


def source_send(
    views: Sequence[torch.Tensor], plan: TransferPlan, groups: SyncGroups, *, star: bool, depth: int = 2
) -> None:
    """Ship every bucket from the source rank: unicast to each rollout rank (star) or broadcast.

    Args:
        views: ``uint8`` views of the full parameters, in plan order.
        plan: supplies topology, metadata and bucket size.
        groups: communicators (broadcast uses ``groups.spanning``).
        star: True for star fan-out, False for the spanning broadcast.
        depth: buckets in flight.
    """
    import torch

    stream = LocalStream(views)
    device = device_of(views, groups.backend)
    in_flight: deque[tuple[torch.Tensor, list[Any]]] = deque()
    for b in plan_full_buckets(plan.metadata, plan.bucket_bytes):
        staging = torch.empty(b.nbytes, dtype=torch.uint8, device=device)
        stream.read_into(Span(start=b.index * plan.bucket_bytes, length=b.nbytes), staging)
        if star:
            works = post([("send", staging, r, b.index) for r in plan.topology.rollout_ranks])
        else:
            works = [_broadcast(staging, plan, groups)]
        in_flight.append((staging, works))
        while len(in_flight) > depth:
            wait_all(in_flight.popleft()[1])
    while in_flight:
        wait_all(in_flight.popleft()[1])


def source_receive(
    views: Sequence[torch.Tensor], plan: TransferPlan, groups: SyncGroups, *, star: bool, depth: int = 2
) -> None:
    """Receive every bucket from the source rank and unpack it (rollout side of ``source_send``)."""
    device = device_of(views, groups.backend)
    buckets = plan_full_buckets(plan.metadata, plan.bucket_bytes)
    pending = deque(_start(b, plan, groups, device, star) for b in buckets[:depth])
    for k in range(len(buckets)):
        b, buf, works = pending.popleft()
        if k + depth < len(buckets):
            pending.append(_start(buckets[k + depth], plan, groups, device, star))
        wait_all(works)
        unpack(buf, b.placements, views)


def _start(
    b: BucketPlan, plan: TransferPlan, groups: SyncGroups, device: torch.device, star: bool
) -> tuple[BucketPlan, torch.Tensor, list[Any]]:
    import torch

    buf = torch.empty(b.nbytes, dtype=torch.uint8, device=device)
    if star:
        return b, buf, post([("recv", buf, plan.topology.source_rank, b.index)])
    return b, buf, [_broadcast(buf, plan, groups)]


def _broadcast(buf: torch.Tensor, plan: TransferPlan, groups: SyncGroups) -> Any:
    import torch.distributed as dist

    return dist.broadcast(buf, src=plan.topology.source_rank, group=groups.spanning, async_op=True)
