"""veRL checkpoint-engine backend ``rollmux``: two-stage weight sync through ``rollmux.sync_plugin``.

Select it with ``actor_rollout_ref.rollout.checkpoint_engine.backend=rollmux``. It is registered in
veRL's ``CheckpointEngineRegistry`` when this module imports: by the adapter's post-import hook on
``verl.checkpoint_engine`` when the job is opted in, or by veRL itself with
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=rollmux.adapters.verl.checkpoint_engine``.

``CheckpointEngineManager`` drives it as every disaggregated backend: ``prepare`` on every actor and
rollout worker, ``build_topology``, ``init_process_group``, then ``send_weights`` on the actor
workers and ``receive_weights`` on the rollout workers, then ``finalize``. Unlike ``nccl`` (actor
rank 0 broadcasts), **every** actor rank is a sender: in each window of parameters, stage 1 scatters
disjoint byte ranges from the trainers to the rollout ranks (one model copy crosses the cut), stage 2
all-gathers them among the rollout ranks. Given veRL's full-tensor generator, trainer ``t`` sends the
``t``-th flat slice; given a training engine with ``get_per_tensor_param_shard`` (veRL's FSDP2
export), it sends its own ``Shard(0)`` shards as they are, without any all-gather.

The sync world is a process group of its own (actor ranks ``0..T-1``, rollout ranks ``T..T+R-1``)
that lives beside the job's default group: ``_SyncWorld.active`` makes it the default group only
while the plugin runs (see there). It is kept across steps while the membership is unchanged.

Engine options (``...checkpoint_engine.engine_kwargs.rollmux.<key>``): ``transport`` (``auto``:
NCCL when CUDA is available, else gloo; ``gloo`` on a GPU host stages through pinned host buffers),
``sync_bucket_megabytes`` (stage-1 bucket, default 64), ``depth`` (buckets in flight, default 3),
``timeout_s`` (default 600), ``rebuild_group`` (a new world every step, default False).
``update_weights_bucket_megabytes`` is the window: parameters buffered per round on each side.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.tensor import Replicate, Shard
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from rollmux.errors import RollMuxError
from rollmux.sync_plugin import (
    ParamMeta,
    PlanError,
    Sharding,
    SyncError,
    SyncGroups,
    SyncTopology,
    create_groups,
    exchange_metadata,
    own_spans,
    param_metadata,
    plan_transfer,
    receive,
    send_local_shard,
)
from rollmux.sync_plugin.tensors import byte_view, owned_parts

BACKEND = "rollmux"
"""Name in ``CheckpointEngineRegistry`` (the value of ``checkpoint_engine.backend``)."""

OPTION_PREFIX = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.rollmux"
TRANSPORTS = ("auto", "gloo", "nccl")
_SWAP = threading.RLock()  # one sync world is the default group at a time, in this process


class CheckpointEngineConfigError(RollMuxError, ValueError):
    """The ``rollmux`` backend is configured or driven in a way it cannot work with."""


class _SyncWorld:
    """A process group over the sync ranks that coexists with the job's own default group.

    ``rollmux.sync_plugin`` runs on the default process group, which in a veRL worker is already
    the job's (FSDP's on the actor side, the rollout workers' gloo group on the other). torch keeps
    every group in process-wide maps keyed by the group object and only the *default* group is a
    singleton, so this world is created, used and destroyed with the default group swapped to it
    for the duration of the call (``active``) and restored afterwards. veRL runs no collective of
    its own while a worker is inside a checkpoint-engine call, and the engine pulls weights from
    veRL's generator outside ``active``.
    """

    def __init__(self, world_id: str, store: Any, rank: int, size: int, backend: str, timeout_s: float) -> None:
        self.id, self.rank, self.size, self.backend = world_id, rank, size, backend
        self._pg: Any = None
        # torch names new groups by a process-wide counter, which differs between an actor and a
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


@CheckpointEngineRegistry.register(BACKEND)
class RollMuxCheckpointEngine(CheckpointEngine):
    """Two-stage (scatter, then all-gather) weight sync between veRL actor and rollout workers.

    Args:
        bucket_size: window bytes (``update_weights_bucket_megabytes << 20``): parameters buffered
            per round on each side.
        is_master: True on actor rank 0 (set by veRL); it serves the rendezvous store.
        transport: ``auto``, ``gloo`` or ``nccl``.
        sync_bucket_megabytes: stage-1 bucket of the sync plugin.
        depth: buckets in flight.
        timeout_s: collective timeout of the sync world.
        rebuild_group: build a new world in every step instead of keeping it.

    Raises:
        CheckpointEngineConfigError: an option is unknown or out of range, or NCCL without CUDA.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, *, transport: str = "auto",
                 sync_bucket_megabytes: float = 64, depth: int = 3, timeout_s: float = 600.0,
                 rebuild_group: bool = False, **unknown: Any) -> None:
        if unknown:
            raise CheckpointEngineConfigError(
                f"unknown {OPTION_PREFIX} options {sorted(unknown)}; known: transport, "
                "sync_bucket_megabytes, depth, timeout_s, rebuild_group")
        self.backend = _transport(transport)
        _positive("update_weights_bucket_megabytes (bucket_size)", bucket_size)
        _positive(f"{OPTION_PREFIX}.sync_bucket_megabytes", sync_bucket_megabytes, number=True)
        _positive(f"{OPTION_PREFIX}.depth", depth)
        self.bucket_size, self.is_master, self.depth = int(bucket_size), bool(is_master), int(depth)
        self.sync_bucket_bytes = max(1, int(sync_bucket_megabytes * (1 << 20)))
        self.timeout_s, self.rebuild_group = float(timeout_s), bool(rebuild_group)
        self._store: Any = None
        self._world: _SyncWorld | None = None
        self._groups: SyncGroups | None = None
        self.n_trainers = 0

    # ---- topology: prepare -> build_topology -> init_process_group -------------------------

    def prepare(self) -> dict[str, Any]:
        """Report this worker's current world; actor rank 0 also serves the rendezvous store."""
        master = None
        if self.is_master:
            if self._store is None:
                host = _node_ip()
                self._store = dist.TCPStore(host, 0, None, True, timedelta(seconds=self.timeout_s),
                                            wait_for_workers=False)
                self._host = host
            master = {"host": self._host, "port": int(self._store.port)}
        w = self._world
        return {"world": None if w is None or self.rebuild_group else w.id, "rank": -1 if w is None else w.rank,
                "size": 0 if w is None else w.size, "trainers": self.n_trainers, "master": master}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Every actor rank sends (ranks ``0..T-1``); rollout ranks are ``T..T+R-1``.

        Raises:
            CheckpointEngineConfigError: actor rank 0 reported no store, or a side is empty.
        """
        t, r = int(actor_wg_world_size), int(rollout_world_size)
        if t < 1 or r < 1:
            raise CheckpointEngineConfigError(
                f"the rollmux backend needs at least one actor and one rollout worker, got {t} and {r}")
        master = metadata[0].get("master") if metadata and isinstance(metadata[0], dict) else None
        if master is None:
            raise CheckpointEngineConfigError(
                "actor rank 0 reported no rollmux rendezvous store: build the engine with "
                "is_master=(rank == 0) on the actor workers (veRL's ActorRolloutRefWorker does) and list the "
                "actor workers before the rollout workers")
        size = t + r
        same = metadata[0]["world"] is not None and all(
            m["world"] == metadata[0]["world"] and m["rank"] == i and m["size"] == size and m["trainers"] == t
            for i, m in enumerate(metadata))
        world = metadata[0]["world"] if same else uuid.uuid4().hex[:12]

        def args(ranks: list[int]) -> dict[str, list[Any]]:
            n = len(ranks)
            return {"rank": ranks, "world_size": [size] * n, "n_trainers": [t] * n,
                    "master_metadata": [master] * n, "world_id": [world] * n}

        return args(list(range(t))), args(list(range(t, size)))

    def init_process_group(self, rank: int, world_size: int, n_trainers: int,
                           master_metadata: dict[str, Any], world_id: str) -> None:
        """Join the sync world ``world_id`` (kept when it is the current one) and create its groups."""
        if self._world is not None and self._world.id == world_id:
            return
        self._close_world()
        store = self._store if self.is_master else dist.TCPStore(
            master_metadata["host"], int(master_metadata["port"]), None, False,
            timedelta(seconds=self.timeout_s))
        self._world = _SyncWorld(world_id, store, rank, world_size, self.backend, self.timeout_s)
        self.n_trainers = n_trainers
        topology = SyncTopology(trainer_ranks=tuple(range(n_trainers)),
                                rollout_ranks=tuple(range(n_trainers, world_size)))
        with self._world.active():
            self._groups = create_groups(topology)

    def finalize(self) -> None:
        """Release device caches; destroy the world only with ``rebuild_group``."""
        if self.rebuild_group:
            self._close_world()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _close_world(self) -> None:
        if self._world is not None:
            self._world.close()
        self._world, self._groups = None, None

    # ---- weights ----------------------------------------------------------------------------

    @torch.no_grad()
    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        """Send this trainer's part of every parameter, window by window.

        Args:
            weights: veRL's ``(name, full tensor)`` generator, or a training engine with
                ``get_per_tensor_param_shard`` (veRL's FSDP2 shard export, sent without gathering).
            global_steps: unused (the rollout side gets it from veRL).

        Returns:
            Sync metrics for the trainer's log (bytes this rank sent, seconds, bytes/s).

        Raises:
            SyncError: this worker is not a trainer of the sync world, or the trainers' windows differ.
            PlanError: a shard does not match the plan (an unsupported sharding).
        """
        world, groups = self._joined("send_weights", trainer=True)
        start, sent, sharded = time.perf_counter(), 0, _is_sharded(weights)
        items = _shard_items(weights) if sharded else iter(weights)
        for window in _windows(items, self.bucket_size, sharded):
            meta = tuple(_meta(w, sharded) for w in window)
            local, error = self._local(window, meta, sharded)
            with world.active():
                plan = self._agree(meta, groups, Sharding.DIM0 if sharded else Sharding.FLAT, error)
            parts = [self._stage(p) for p in local]
            _sync_device(parts)
            with world.active():
                send_local_shard(parts, plan, groups, depth=self.depth)
            if self.backend == "nccl":
                torch.cuda.synchronize()  # the window's staging buffers are freed next
            sent += plan.local_bytes(world.rank)
        with world.active():
            self._agree(None, groups, None)
        seconds = time.perf_counter() - start
        return {"rollmux_sync/sent_bytes": float(sent), "rollmux_sync/seconds": seconds,
                "rollmux_sync/bytes_per_s": sent / seconds if seconds > 0 else 0.0}

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        """Receive full parameters, window by window, and yield them as ``(name, tensor)``.

        Each window's tensors are fresh buffers, so a consumer may keep them.

        Raises:
            SyncError: this worker is not a rollout rank of the sync world.
        """
        world, groups = self._joined("receive_weights", trainer=False)
        out = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        while True:
            with world.active():
                plan = self._agree(None, groups, None)
                if plan is None:
                    return
                buffers = [self._buffer(m) for m in plan.metadata]
                receive(buffers, plan, groups, depth=self.depth)
                _sync_device(buffers)
            for m, b in zip(plan.metadata, buffers):
                yield m.name, (b if out is None or b.device == out else b.to(out, non_blocking=True))

    def _agree(self, meta: tuple[ParamMeta, ...] | None, groups: SyncGroups, sharding: Sharding | None,
               error: str | None = None) -> Any:
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
        mine = (meta, sharding, self.sync_bucket_bytes, error) if rank < self.n_trainers else None
        dist.all_gather_object(notes, mine)
        failed = [(r, n[3]) for r, n in enumerate(notes) if n is not None and n[3]]
        if failed:
            raise SyncError(f"trainer rank {failed[0][0]} cannot send its weights: {failed[0][1]}")
        announced, how, bucket_bytes, _ = notes[0]  # trainer 0's plan parameters hold for every rank
        exchange_metadata(tuple((announced if rank >= self.n_trainers else meta) or ()), groups.topology)
        if announced is None:
            return None
        return plan_transfer(groups.topology, announced, bucket_bytes, how)

    def _local(self, window: list[Any], meta: tuple[ParamMeta, ...],
               sharded: bool) -> tuple[list[torch.Tensor], str | None]:
        """This trainer's bytes of a window (its DIM0 shards, or its FLAT slice of the full tensors)."""
        rank = self._world.rank if self._world is not None else 0
        try:
            if sharded:
                return [_owned(w, m, rank, self.n_trainers) for w, m in zip(window, meta)], None
            mine = own_spans(meta, self.n_trainers, Sharding.FLAT)[rank]
            return owned_parts([byte_view(w[1]) for w in window], mine), None
        except PlanError as exc:
            return [], str(exc)

    def _joined(self, call: str, *, trainer: bool) -> tuple[_SyncWorld, SyncGroups]:
        if self._world is None or self._groups is None:
            raise SyncError(f"{call} before init_process_group: CheckpointEngineManager.build_process_group "
                            "must run first (veRL's update_weights does)")
        role = "trainer" if trainer else "rollout"
        if (self._world.rank < self.n_trainers) != trainer:
            raise SyncError(f"{call} called on sync rank {self._world.rank}, which is not a {role} rank "
                            f"(trainers are 0..{self.n_trainers - 1})")
        return self._world, self._groups

    def _stage(self, t: torch.Tensor) -> torch.Tensor:
        """Put a tensor where the transport reads it: on the GPU for NCCL, in host memory for gloo."""
        if self.backend == "nccl":
            return t if t.is_cuda else t.to(torch.device("cuda", torch.cuda.current_device()))
        if not t.is_cuda:
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

    def _buffer(self, m: ParamMeta) -> torch.Tensor:
        dtype = getattr(torch, m.dtype)
        if self.backend == "nccl":
            return torch.empty(m.shape, dtype=dtype, device=torch.device("cuda", torch.cuda.current_device()))
        return torch.empty(m.shape, dtype=dtype, pin_memory=torch.cuda.is_available())


# ---- helpers (pure, or touching only the tensors handed in) ---------------------------------


def _transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise CheckpointEngineConfigError(f"{OPTION_PREFIX}.transport={name!r}; choose one of {TRANSPORTS}")
    if name == "nccl" and not torch.cuda.is_available():
        raise CheckpointEngineConfigError(
            f"{OPTION_PREFIX}.transport='nccl' but this worker has no CUDA device; use 'gloo' or 'auto'")
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return name


def _positive(field: str, value: Any, *, number: bool = False) -> None:
    kinds = (int, float) if number else (int,)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
        raise CheckpointEngineConfigError(f"{field}={value!r} must be a positive {'number' if number else 'integer'}")


def _node_ip() -> str:
    return ray.util.get_node_ip_address().strip("[]") if ray.is_initialized() else "127.0.0.1"


def _is_sharded(weights: Any) -> bool:
    return hasattr(weights, "get_per_tensor_param_shard")


def _shard_items(engine: Any) -> Iterator[tuple[str, torch.Tensor, Any]]:
    gen, _peft = engine.get_per_tensor_param_shard()
    return iter(gen)


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
        f"{tuple(mesh.shape) if mesh is not None else None}: the rollmux backend sends FSDP2 Shard(0) shards "
        f"over a 1-D mesh of all {n_trainers} actor ranks in actor-rank order; pass veRL's full-tensor "
        "generator (get_per_tensor_param) for other layouts")


def _check_bytes(name: str, flat: torch.Tensor, expected: int, what: str) -> None:
    got = flat.numel() * flat.element_size()
    if got != expected:
        raise PlanError(f"parameter {name!r}: the {what} has {got} bytes, the plan expects {expected}")


def _sync_device(tensors: Sequence[torch.Tensor]) -> None:
    """Wait for queued device copies (CUDA) before a buffer is read by the transport or a consumer."""
    if torch.cuda.is_available() and any(t.is_cuda or t.is_pinned() for t in tensors):
        torch.cuda.current_stream().synchronize()
