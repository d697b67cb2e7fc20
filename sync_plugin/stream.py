"""A weight-sync session between a job's trainer and rollout processes, window by window.

The part both adapters share (veRL's ``rollmux`` checkpoint-engine backend and ROLL's model
update): a :class:`SyncWorld` (a process group of the sync ranks that lives beside the job's own
default group) and a :class:`WindowStream` over it, which moves the weights in windows of about
``window_bytes`` so neither side ever holds more than one window beyond the model:

* trainer 0 announces each window's parameter list and every rank checks it
  (:meth:`WindowStream._agree`): a trainer that cannot send fails every rank before a byte moves;
* stage 1 scatters disjoint byte ranges from the trainers to the rollout ranks (one model copy
  crosses the cut), stage 2 all-gathers them among the rollout ranks (``rollmux.sync_plugin``).

Trainers hand in either ``(name, full tensor)`` pairs (each sends its ``Sharding.FLAT`` slice) or
``(name, local shard, spec)`` triples of FSDP2 ``Shard(0)`` parameters (each sends its own shard as
it is, without an all-gather); :func:`dtensor_items` makes the triples from a module's DTensors.

Transports: ``nccl`` (buffers on the current CUDA device) or ``gloo`` (host buffers, pinned when a
GPU is present, so a GPU host stages through DMA-able memory).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.tensor import DTensor, Replicate, Shard

from rollmux.sync_plugin.api import ParamMeta, PlanError, Sharding, SyncError, SyncTopology
from rollmux.sync_plugin.engine import receive, send_local_shard
from rollmux.sync_plugin.groups import SyncGroups, create_groups, exchange_metadata
from rollmux.sync_plugin.plan import DEFAULT_BUCKET_BYTES, own_spans, plan_transfer
from rollmux.sync_plugin.tensors import byte_view, owned_parts, param_metadata

TRANSPORTS = ("auto", "gloo", "nccl")
_SWAP = threading.RLock()  # one sync world is the default group at a time, in this process


def transport(name: str) -> str:
    """The collective backend for ``name`` (``auto``: NCCL when CUDA is available, else gloo).

    Raises:
        ValueError: an unknown name, or ``nccl`` without CUDA.
    """
    if name not in TRANSPORTS:
        raise ValueError(f"transport={name!r}; choose one of {TRANSPORTS}")
    if name == "nccl" and not torch.cuda.is_available():
        raise ValueError("transport='nccl' but this process has no CUDA device; use 'gloo' or 'auto'")
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return name


def serve_store(host: str, timeout_s: float) -> Any:
    """A rendezvous store served by this process on ``host`` (any free port: ``store.port``)."""
    return dist.TCPStore(host, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)


def connect_store(host: str, port: int, timeout_s: float) -> Any:
    return dist.TCPStore(host, int(port), None, False, timedelta(seconds=timeout_s))


class SyncWorld:
    """A process group over the sync ranks that coexists with the job's own default group.

    ``rollmux.sync_plugin`` runs on the default process group, which in a trainer or rollout
    worker is already the job's (FSDP's on the trainer side). torch keeps every group in
    process-wide maps keyed by the group object and only the *default* group is a singleton, so
    this world is created, used and destroyed with the default group swapped to it for the
    duration of the call (:meth:`active`) and restored afterwards. The frameworks run no
    collective of their own while a worker is inside a weight sync.
    """

    def __init__(self, world_id: str, store: Any, rank: int, size: int, backend: str, timeout_s: float) -> None:
        self.id, self.rank, self.size, self.backend = world_id, rank, size, backend
        self._store = store  # rank 0 serves the store: it must live as long as the world
        self._pg: Any = None
        # torch names new groups by a process-wide counter, which differs between a trainer and a
        # rollout process (the job made other groups in each); ranks of one world must agree on
        # the names, so the world counts its groups from a base derived from its id.
        self._group_count = (1 + int(uuid.uuid5(uuid.NAMESPACE_OID, world_id).hex[:6], 16)) * 1000
        self._subgroups: list[Any] = []  # groups created inside ``active`` (by create_groups)
        with self.active():
            dist.init_process_group(
                backend, store=dist.PrefixStore(f"rollmux/{world_id}", store), rank=rank, world_size=size,
                timeout=timedelta(seconds=timeout_s), group_name=f"rollmux-sync-{world_id}",
            )
            self._pg = c10d._get_default_group()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make this world the default process group inside the block."""
        with _SWAP:
            saved, saved_count = c10d._world.default_pg, c10d._world.group_count
            before = set(c10d._world.pg_map)
            c10d._update_default_pg(self._pg)
            c10d._world.group_count = self._group_count
            try:
                yield
            finally:
                self._group_count = c10d._world.group_count
                c10d._world.group_count = saved_count
                c10d._update_default_pg(saved)
                self._subgroups += [pg for pg in c10d._world.pg_map if pg not in before and pg is not self._pg]

    def close(self) -> None:
        """Destroy this world's groups (subgroups first), leaving the job's groups untouched."""
        with _SWAP:
            saved = c10d._world.default_pg
            try:
                c10d._update_default_pg(self._pg)
                for pg in self._subgroups:
                    dist.destroy_process_group(pg)
                c10d._update_default_pg(None)  # else destroying the default group tears down every group
                dist.destroy_process_group(self._pg)
            finally:
                c10d._update_default_pg(saved)
                self._subgroups = []


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """How a local tensor sits in its full parameter (veRL's engine ``ShardSpec`` has the same fields)."""

    full_shape: tuple[int, ...]
    placements: tuple[Any, ...]
    mesh: Any


def dtensor_items(named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor, ShardSpec]]:
    """``(name, local shard, spec)`` for a module's parameters (plain tensors count as replicated)."""
    for name, p in named:
        t = p.data if hasattr(p, "data") else p
        if isinstance(t, DTensor):
            yield name, t.to_local(), ShardSpec(tuple(t.shape), tuple(t.placements), t.device_mesh)
        else:
            yield name, t, ShardSpec(tuple(t.shape), (Replicate(),), None)


class WindowStream:
    """Weights from the trainers (sync ranks ``0..T-1``) to the rollout ranks (``T..``), window by window.

    Args:
        world: the sync world (joined by every rank).
        n_trainers: T.
        window_bytes: full-parameter bytes per window (the most either side buffers at once).
        bucket_bytes: stage-1 bucket of the sync plugin.
        depth: buckets in flight.

    All ranks of the world build it together (it creates the plugin's groups: collective).
    """

    def __init__(self, world: SyncWorld, n_trainers: int, *, window_bytes: int,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, depth: int = 3) -> None:
        if not 0 < n_trainers < world.size:
            raise SyncError(f"a sync world of {world.size} ranks cannot have {n_trainers} trainers")
        self.world, self.n_trainers = world, int(n_trainers)
        self.window_bytes, self.bucket_bytes, self.depth = int(window_bytes), int(bucket_bytes), int(depth)
        topology = SyncTopology(trainer_ranks=tuple(range(n_trainers)),
                                rollout_ranks=tuple(range(n_trainers, world.size)))
        with world.active():
            self.groups: SyncGroups = create_groups(topology)

    @property
    def is_trainer(self) -> bool:
        return self.world.rank < self.n_trainers

    def close(self) -> None:
        self.world.close()

    # ---- trainers ---------------------------------------------------------------------------

    @torch.no_grad()
    def send(self, items: Iterable[Any], *, sharded: bool) -> dict[str, float]:
        """Send this trainer's part of every parameter; returns bytes sent, seconds and bytes/s.

        Args:
            items: ``(name, full tensor)`` pairs, or with ``sharded`` ``(name, local, spec)`` triples.

        Raises:
            SyncError: this rank is no trainer, or a trainer (any) cannot send its window.
            PlanError: a shard does not match the plan (an unsupported sharding).
        """
        self._check_role("send", trainer=True)
        start, sent = time.perf_counter(), 0
        for window in _windows(items, self.window_bytes, sharded):
            meta = tuple(_meta(w, sharded) for w in window)
            local, error = self._local(window, meta, sharded)
            with self.world.active():
                plan = self._agree(meta, Sharding.DIM0 if sharded else Sharding.FLAT, error)
            parts = [self._stage(p) for p in local]
            _sync_device(parts)
            with self.world.active():
                send_local_shard(parts, plan, self.groups, depth=self.depth)
            if self.world.backend == "nccl":
                torch.cuda.synchronize()  # the window's staging buffers are freed next
            sent += plan.local_bytes(self.world.rank)
        with self.world.active():
            self._agree(None, None)
        seconds = time.perf_counter() - start
        return {"sent_bytes": float(sent), "seconds": seconds, "bytes_per_s": sent / seconds if seconds > 0 else 0.0}

    # ---- rollout ranks ----------------------------------------------------------------------

    @torch.no_grad()
    def receive(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters, one window at a time (fresh buffers: a consumer may keep them).

        Raises:
            SyncError: this rank is a trainer.
        """
        self._check_role("receive", trainer=False)
        while True:
            with self.world.active():
                plan = self._agree(None, None)
                if plan is None:
                    return
                buffers = [self._buffer(m) for m in plan.metadata]
                receive(buffers, plan, self.groups, depth=self.depth)
                _sync_device(buffers)
            yield [(m.name, b) for m, b in zip(plan.metadata, buffers)]

    # ---- both -------------------------------------------------------------------------------

    def _agree(self, meta: tuple[ParamMeta, ...] | None, sharding: Sharding | None, error: str | None = None) -> Any:
        """Trainer 0 announces the next window (None: the end), every rank checks it; returns its plan.

        Trainers pass their own next window (None when they have none left) and the error that keeps
        them from sending it, if any; rollout ranks pass None and learn window and sharding from the
        announcement. So a bad shard or a trainer with other parameters fails every rank at once,
        before any byte of the window moves, instead of leaving the others waiting.

        Raises:
            SyncError: a trainer reported an error (on every rank).
            MetadataMismatchError: a trainer's window differs from trainer 0's (on every rank).
        """
        rank = dist.get_rank()
        notes: list[Any] = [None] * dist.get_world_size()
        mine = (meta, sharding, self.bucket_bytes, error) if rank < self.n_trainers else None
        dist.all_gather_object(notes, mine)
        failed = [(r, n[3]) for r, n in enumerate(notes) if n is not None and n[3]]
        if failed:
            raise SyncError(f"trainer rank {failed[0][0]} cannot send its weights: {failed[0][1]}")
        announced, how, bucket_bytes, _ = notes[0]  # trainer 0's plan parameters hold for every rank
        exchange_metadata(tuple((announced if rank >= self.n_trainers else meta) or ()), self.groups.topology)
        if announced is None:
            return None
        return plan_transfer(self.groups.topology, announced, bucket_bytes, how)

    def _local(self, window: list[Any], meta: tuple[ParamMeta, ...],
               sharded: bool) -> tuple[list[torch.Tensor], str | None]:
        """This trainer's bytes of a window (its DIM0 shards, or its FLAT slice of the full tensors)."""
        rank = self.world.rank
        try:
            if sharded:
                return [_owned(w, m, rank, self.n_trainers) for w, m in zip(window, meta)], None
            mine = own_spans(meta, self.n_trainers, Sharding.FLAT)[rank]
            return owned_parts([byte_view(w[1]) for w in window], mine), None
        except PlanError as exc:
            return [], str(exc)

    def _check_role(self, call: str, *, trainer: bool) -> None:
        if self.is_trainer != trainer:
            role = "trainer" if trainer else "rollout"
            raise SyncError(f"{call} called on sync rank {self.world.rank}, which is not a {role} rank "
                            f"(trainers are 0..{self.n_trainers - 1})")

    def _stage(self, t: torch.Tensor) -> torch.Tensor:
        """Put a tensor where the transport reads it: on the GPU for NCCL, in host memory for gloo."""
        if self.world.backend == "nccl":
            return t if t.is_cuda else t.to(torch.device("cuda", torch.cuda.current_device()))
        if not t.is_cuda:
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

    def _buffer(self, m: ParamMeta) -> torch.Tensor:
        dtype = getattr(torch, m.dtype)
        if self.world.backend == "nccl":
            return torch.empty(m.shape, dtype=dtype, device=torch.device("cuda", torch.cuda.current_device()))
        return torch.empty(m.shape, dtype=dtype, pin_memory=torch.cuda.is_available())


# ---- helpers (pure, or touching only the tensors handed in) ---------------------------------


def _windows(items: Iterable[Any], window_bytes: int, sharded: bool) -> Iterator[list[Any]]:
    """Group consecutive parameters into windows of about ``window_bytes`` (full-parameter bytes)."""
    window: list[Any] = []
    size = 0
    for item in items:
        window.append(item)
        size += _meta(item, sharded).nbytes
        if size >= window_bytes:
            yield window
            window, size = [], 0
    if window:
        yield window


def _meta(item: Any, sharded: bool) -> ParamMeta:
    if not sharded:
        return param_metadata([(item[0], item[1])])[0]
    name, local, spec = item
    return ParamMeta(name=name, shape=tuple(spec.full_shape), dtype=str(local.dtype).removeprefix("torch."),
                     itemsize=local.element_size())


def _owned(item: tuple[str, torch.Tensor, Any], meta: ParamMeta, trainer: int, n_trainers: int) -> torch.Tensor:
    """The bytes of one parameter that trainer ``trainer`` owns under ``Sharding.DIM0``.

    A ``Shard(0)`` shard over a 1-D mesh of all trainers is exactly those bytes (FSDP2 and
    ``torch.chunk`` split dim 0 alike); an unsharded or replicated tensor is sliced locally.

    Raises:
        PlanError: any other placement, or a shard of the wrong size.
    """
    name, local, spec = item
    spans = own_spans((meta,), n_trainers, Sharding.DIM0)[trainer]
    lo, n = (spans[0].start, spans[0].length) if spans else (0, 0)
    placements = tuple(spec.placements or ())
    flat = local.reshape(-1)
    if getattr(spec, "place", None) is None and all(isinstance(p, Replicate) for p in placements):
        _check_bytes(name, flat, meta.nbytes, "full tensor")
        return flat.view(torch.uint8)[lo: lo + n] if flat.numel() else flat.view(torch.uint8)
    mesh = spec.mesh
    if (getattr(spec, "place", None) is None and len(placements) == 1 and isinstance(placements[0], Shard)
            and placements[0].dim == 0 and mesh.size() == n_trainers and mesh.get_local_rank() == trainer):
        _check_bytes(name, flat, n, f"Shard(0) shard of trainer {trainer}")
        return flat
    raise PlanError(
        f"parameter {name!r} has placements {placements} on a mesh of shape "
        f"{tuple(mesh.shape) if mesh is not None else None}: the sharded path sends FSDP2 Shard(0) shards "
        f"over a 1-D mesh of all {n_trainers} trainer ranks in trainer-rank order; send full tensors "
        "for other layouts")


def _check_bytes(name: str, flat: torch.Tensor, expected: int, what: str) -> None:
    got = flat.numel() * flat.element_size()
    if got != expected:
        raise PlanError(f"parameter {name!r}: the {what} has {got} bytes, the plan expects {expected}")


def _sync_device(tensors: Sequence[torch.Tensor]) -> None:
    """Wait for queued device copies (CUDA) before a buffer is read by the transport or a consumer."""
    if torch.cuda.is_available() and any(t.is_cuda or t.is_pinned() for t in tensors):
        torch.cuda.current_stream().synchronize()
