"""Pure two-stage planner: which bytes each trainer sends to which rollout rank, bucket by bucket.

Layout (all offsets in bytes, so mixed dtypes and odd sizes move bitwise):

1. Ownership: each trainer owns a set of spans of the global stream (``Sharding``); their
   concatenation is the trainer's *local stream*, which is all an FSDP rank holds.
2. Buckets: bucket k takes the k-th chunk (``bucket_bytes / N_T`` bytes) of every trainer's local
   stream and lays them end to end, so every trainer sends in every bucket.
3. Pieces: each bucket is cut into ``N_R`` equal pieces (the last padded); rollout rank j receives
   piece j in stage 1 from whichever trainers' chunks overlap it, then stage 2 all-gathers the pieces.

Every byte crosses the cut exactly once; each rollout rank receives about M/N_R bytes in stage 1.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from rollmux.sync_plugin.api import (
    BucketPlan,
    ParamMeta,
    Placement,
    PlanError,
    Sharding,
    Span,
    SyncTopology,
    Transfer,
    TransferPlan,
)

DEFAULT_BUCKET_BYTES = 64 << 20
"""Default payload per bucket (64 MiB): big enough to amortise per-message cost, small enough to pipeline."""


def plan_transfer(
    topology: SyncTopology,
    metadata: Sequence[ParamMeta],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    sharding: Sharding = Sharding.FLAT,
) -> TransferPlan:
    """Compute the two-stage transfer plan as data, before any collective call.

    Args:
        topology: trainer and rollout ranks.
        metadata: parameters in the order both sides iterate them.
        bucket_bytes: target payload per bucket; each trainer contributes ``bucket_bytes // N_T``.
        sharding: which bytes each trainer rank owns.

    Returns:
        The plan; ``plan.cut_bytes() == plan.total_bytes``.

    Raises:
        PlanError: ``bucket_bytes`` is not positive or parameter names repeat.
    """
    if bucket_bytes <= 0:
        raise PlanError(f"bucket_bytes={bucket_bytes} must be positive")
    meta = tuple(metadata)
    _check_unique_names(meta)
    ownership = own_spans(meta, topology.n_trainers, Sharding(sharding))
    chunk = max(1, bucket_bytes // topology.n_trainers)
    local_len = [sum(s.length for s in spans) for spans in ownership]
    n_buckets = max((-(-n // chunk) for n in local_len), default=0)
    starts = _param_starts(meta)
    buckets = tuple(
        _bucket(k, chunk, local_len, ownership, topology.n_rollouts, meta, starts) for k in range(n_buckets)
    )
    plan = TransferPlan(
        topology=topology,
        metadata=meta,
        sharding=Sharding(sharding),
        bucket_bytes=bucket_bytes,
        ownership=ownership,
        buckets=buckets,
    )
    if plan.cut_bytes() != plan.total_bytes:  # invariant: exactly one copy crosses the cut
        raise PlanError(f"plan moves {plan.cut_bytes()} bytes for a model of {plan.total_bytes}")
    return plan


def plan_full_buckets(
    metadata: Sequence[ParamMeta], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> tuple[BucketPlan, ...]:
    """Cut the global stream into plain buckets for single-source schemes (star, broadcast).

    Args:
        metadata: parameters in global-stream order.
        bucket_bytes: payload per bucket.

    Returns:
        Buckets without stage-1 transfers; ``piece_bytes == nbytes`` and placements cover each bucket.
    """
    if bucket_bytes <= 0:
        raise PlanError(f"bucket_bytes={bucket_bytes} must be positive")
    meta = tuple(metadata)
    starts = _param_starts(meta)
    total = sum(m.nbytes for m in meta)
    out = []
    for k, lo in enumerate(range(0, total, bucket_bytes)):
        n = min(bucket_bytes, total - lo)
        placements = tuple(_placements(0, Span(start=lo, length=n), meta, starts))
        out.append(
            BucketPlan(index=k, nbytes=n, piece_bytes=n, chunks=(), transfers=(), placements=placements)
        )
    return tuple(out)


def own_spans(meta: Sequence[ParamMeta], n_trainers: int, sharding: Sharding) -> tuple[tuple[Span, ...], ...]:
    """Return, per trainer, the global-stream spans it owns (disjoint, together covering the stream).

    Args:
        meta: parameters in global-stream order.
        n_trainers: N_T.
        sharding: FLAT (even contiguous split) or DIM0 (per-parameter ``torch.chunk`` along dim 0).

    Returns:
        One tuple of merged spans per trainer.
    """
    total = sum(m.nbytes for m in meta)
    if sharding is Sharding.FLAT:
        bounds = [t * total // n_trainers for t in range(n_trainers + 1)]
        return tuple((Span(start=bounds[t], length=bounds[t + 1] - bounds[t]),) for t in range(n_trainers))
    per: list[list[Span]] = [[] for _ in range(n_trainers)]
    offset = 0
    for m in meta:
        for t, (lo, n) in enumerate(_dim0_split(m, n_trainers)):
            if n:
                _append_merged(per[t], Span(start=offset + lo, length=n))
        offset += m.nbytes
    return tuple(tuple(spans) for spans in per)


def _dim0_split(m: ParamMeta, n_trainers: int) -> list[tuple[int, int]]:
    """``torch.chunk(n_trainers, dim=0)`` as (byte offset, bytes) per trainer; scalars go to trainer 0."""
    if not m.shape or m.shape[0] == 0:
        return [(0, m.nbytes)] + [(0, 0)] * (n_trainers - 1)
    rows = m.shape[0]
    row_bytes = m.nbytes // rows
    per = -(-rows // n_trainers)
    out = []
    for t in range(n_trainers):
        lo, hi = min(t * per, rows), min((t + 1) * per, rows)
        out.append((lo * row_bytes, (hi - lo) * row_bytes))
    return out


def _append_merged(spans: list[Span], span: Span) -> None:
    if spans and spans[-1].stop == span.start:
        spans[-1] = Span(start=spans[-1].start, length=spans[-1].length + span.length)
    else:
        spans.append(span)


def _bucket(
    k: int,
    chunk: int,
    local_len: list[int],
    ownership: tuple[tuple[Span, ...], ...],
    n_rollouts: int,
    meta: tuple[ParamMeta, ...],
    starts: list[int],
) -> BucketPlan:
    chunks = tuple(
        Span(start=min(k * chunk, n), length=max(0, min((k + 1) * chunk, n) - k * chunk)) for n in local_len
    )
    bases, base = [], 0
    for c in chunks:
        bases.append(base)
        base += c.length
    nbytes = base
    piece = -(-nbytes // n_rollouts)
    transfers = []
    for j in range(n_rollouts):
        p_lo, p_hi = j * piece, min((j + 1) * piece, nbytes)
        for t, c in enumerate(chunks):
            lo, hi = max(p_lo, bases[t]), min(p_hi, bases[t] + c.length)
            if hi > lo:
                transfers.append(
                    Transfer(
                        bucket=k,
                        trainer=t,
                        rollout=j,
                        src_offset=c.start + lo - bases[t],
                        dst_offset=lo - p_lo,
                        length=hi - lo,
                    )
                )
    placements: list[Placement] = []
    for t, c in enumerate(chunks):
        for bucket_off, g in _local_to_global(ownership[t], c, bases[t]):
            placements.extend(_placements(bucket_off, g, meta, starts))
    return BucketPlan(
        index=k,
        nbytes=nbytes,
        piece_bytes=piece,
        chunks=chunks,
        transfers=tuple(transfers),
        placements=tuple(placements),
    )


def _local_to_global(spans: tuple[Span, ...], local: Span, bucket_base: int) -> Iterator[tuple[int, Span]]:
    """Map a span of a trainer's local stream to (bucket offset, global span) pieces."""
    pos = 0
    for s in spans:
        lo, hi = max(local.start, pos), min(local.stop, pos + s.length)
        if hi > lo:
            yield bucket_base + lo - local.start, Span(start=s.start + lo - pos, length=hi - lo)
        pos += s.length
        if pos >= local.stop:
            return


def _placements(
    bucket_off: int, g: Span, meta: tuple[ParamMeta, ...], starts: list[int]
) -> Iterator[Placement]:
    """Split a global span at parameter boundaries."""
    i = bisect.bisect_right(starts, g.start) - 1
    while i > 0 and starts[i - 1] == starts[i]:  # step back over empty parameters sharing this start
        i -= 1
    pos = g.start
    while pos < g.stop:
        end = starts[i] + meta[i].nbytes
        if end > pos:
            n = min(end, g.stop) - pos
            yield Placement(
                bucket_offset=bucket_off + pos - g.start, param=i, param_offset=pos - starts[i], length=n
            )
            pos += n
        i += 1


def _param_starts(meta: tuple[ParamMeta, ...]) -> list[int]:
    out, pos = [], 0
    for m in meta:
        out.append(pos)
        pos += m.nbytes
    return out


def _check_unique_names(meta: tuple[ParamMeta, ...]) -> None:
    seen: set[str] = set()
    for m in meta:
        if m.name in seen:
            raise PlanError(f"parameter name {m.name!r} appears twice; names must be unique")
        seen.add(m.name)
