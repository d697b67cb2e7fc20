"""Byte-level views of tensors: metadata, local streams, packing and unpacking.

Weights move as raw bytes (``uint8`` views), which is what makes mixed dtypes and odd sizes arrive
bitwise identical. Torch is imported lazily; importing this module does not import torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rollmux.sync_plugin.api import ParamMeta, Placement, PlanError, Span

if TYPE_CHECKING:
    import torch

NamedTensors = Mapping[str, "torch.Tensor"] | Iterable[tuple[str, "torch.Tensor"]]
"""Parameters as ``{name: tensor}`` or ``(name, tensor)`` pairs, in the order both sides agree on."""


def named_list(params: NamedTensors) -> list[tuple[str, torch.Tensor]]:
    """Return ``params`` as a list of (name, tensor) pairs, keeping their order."""
    items = params.items() if isinstance(params, Mapping) else params
    return [(str(n), t) for n, t in items]


def param_metadata(params: NamedTensors) -> tuple[ParamMeta, ...]:
    """Describe full (unsharded) parameters for planning and the metadata exchange.

    Args:
        params: named tensors, in order.

    Returns:
        One ``ParamMeta`` per tensor.
    """
    return tuple(
        ParamMeta(
            name=n, shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."), itemsize=t.element_size()
        )
        for n, t in named_list(params)
    )


def byte_view(t: torch.Tensor, *, writable: bool = False) -> torch.Tensor:
    """Return a flat ``uint8`` view of ``t`` sharing its storage.

    Args:
        t: any tensor.
        writable: the view will be written to, so ``t`` must be contiguous (a copy would drop the writes).

    Raises:
        PlanError: ``writable`` and ``t`` is not contiguous.
    """
    import torch

    if not t.is_contiguous():
        if writable:
            raise PlanError(
                f"receive buffer of shape {tuple(t.shape)} is not contiguous; pass contiguous tensors"
            )
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


class LocalStream:
    """A trainer's local stream: byte views laid end to end, read by span into a staging buffer."""

    __slots__ = ("_parts", "_starts", "nbytes")

    def __init__(self, parts: Sequence[torch.Tensor]) -> None:
        self._parts = list(parts)
        self._starts = []
        pos = 0
        for p in self._parts:
            self._starts.append(pos)
            pos += p.numel()
        self.nbytes = pos

    def read_into(self, span: Span, out: torch.Tensor) -> None:
        """Copy the bytes of ``span`` into ``out[:span.length]``."""
        i = max(0, bisect.bisect_right(self._starts, span.start) - 1)
        while i < len(self._parts) and self._starts[i] < span.stop:
            start, part = self._starts[i], self._parts[i]
            lo, hi = max(span.start, start), min(span.stop, start + part.numel())
            if hi > lo:
                out[lo - span.start : hi - span.start].copy_(part[lo - start : hi - start], non_blocking=True)
            i += 1


def owned_parts(views: Sequence[torch.Tensor], ownership: Sequence[Span]) -> list[torch.Tensor]:
    """Slice full-parameter byte views down to the global spans a trainer owns, in order.

    Both lists are sorted by global offset, so one merge walk does it (linear in params + spans).
    """
    out = []
    i, start = 0, 0
    for s in ownership:
        while i < len(views) and start + views[i].numel() <= s.start:
            start += views[i].numel()
            i += 1
        j, pos = i, start
        while j < len(views) and pos < s.stop:
            lo, hi = max(s.start, pos), min(s.stop, pos + views[j].numel())
            if hi > lo:
                out.append(views[j][lo - pos : hi - pos])
            pos += views[j].numel()
            j += 1
    return out


def unpack(buffer: torch.Tensor, placements: Iterable[Placement], views: Sequence[torch.Tensor]) -> None:
    """Copy a gathered bucket into the parameters' byte views."""
    for p in placements:
        views[p.param][p.param_offset : p.param_offset + p.length].copy_(
            buffer[p.bucket_offset : p.bucket_offset + p.length], non_blocking=True
        )


def check_buffers(meta: Sequence[ParamMeta], tensors: Sequence[torch.Tensor], what: str) -> None:
    """Check that tensors handed to send/receive match the plan's metadata one by one.

    Raises:
        PlanError: count, shape or dtype differ; the message names the parameter.
    """
    if len(meta) != len(tensors):
        raise PlanError(f"{what}: got {len(tensors)} tensors but the plan has {len(meta)} parameters")
    for m, t in zip(meta, tensors):
        dtype = str(t.dtype).removeprefix("torch.")
        if tuple(t.shape) != m.shape or dtype != m.dtype:
            raise PlanError(
                f"{what}: tensor for {m.describe()} has shape={tuple(t.shape)} dtype={dtype}; "
                "rebuild the plan from these tensors' metadata"
            )
