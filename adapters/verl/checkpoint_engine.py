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

The sync world (actor ranks ``0..T-1``, rollout ranks ``T..T+R-1``) and the window protocol are
``rollmux.sync_plugin.stream``'s, shared with the ROLL adapter; the world is kept across steps while
the membership is unchanged.

Co-located jobs are refused before any transfer: under NCCL each worker reports its GPU (node and
device UUID) in ``prepare`` and ``build_topology`` refuses two ranks on one GPU, which NCCL cannot
connect (a hybrid-engine job's trainer and rollout share GPUs; veRL's ``naive`` backend updates such
replicas in place). The driver refuses the backend for a co-located config even earlier
(``sync_backend.choose_default``).

Engine options (``...checkpoint_engine.engine_kwargs.rollmux.<key>``): ``transport`` (``auto``:
NCCL when CUDA is available, else gloo; ``gloo`` on a GPU host stages through pinned host buffers),
``sync_bucket_megabytes`` (stage-1 bucket, default 64), ``depth`` (buckets in flight, default 3),
``timeout_s`` (default 600), ``rebuild_group`` (a new world every step, default False).
``update_weights_bucket_megabytes`` is the window: parameters buffered per round on each side.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from rollmux.core.errors import RollMuxError
from rollmux.sync_plugin import SyncError
from rollmux.sync_plugin.stream import SyncWorld, WindowStream, connect_store, serve_store, transport

BACKEND = "rollmux"
"""Name in ``CheckpointEngineRegistry`` (the value of ``checkpoint_engine.backend``)."""

OPTION_PREFIX = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.rollmux"


class CheckpointEngineConfigError(RollMuxError, ValueError):
    """The ``rollmux`` backend is configured or driven in a way it cannot work with."""


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
        self._stream: WindowStream | None = None
        self.n_trainers = 0

    # ---- topology: prepare -> build_topology -> init_process_group -------------------------

    def prepare(self) -> dict[str, Any]:
        """Report this worker's current world; actor rank 0 also serves the rendezvous store."""
        master = None
        if self.is_master:
            if self._store is None:
                self._host = _node_ip()
                self._store = serve_store(self._host, self.timeout_s)
            master = {"host": self._host, "port": int(self._store.port)}
        w = self._stream.world if self._stream is not None else None
        return {"world": None if w is None or self.rebuild_group else w.id, "rank": -1 if w is None else w.rank,
                "size": 0 if w is None else w.size, "trainers": self.n_trainers, "master": master,
                "gpu": _gpu_identity() if self.backend == "nccl" else None}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Every actor rank sends (ranks ``0..T-1``); rollout ranks are ``T..T+R-1``.

        Raises:
            CheckpointEngineConfigError: actor rank 0 reported no store, a side is empty, or two ranks
                share a GPU under NCCL (a co-located job).
        """
        t, r = int(actor_wg_world_size), int(rollout_world_size)
        if t < 1 or r < 1:
            raise CheckpointEngineConfigError(
                f"the rollmux backend needs at least one actor and one rollout worker, got {t} and {r}")
        _refuse_shared_gpus(metadata)
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
        if self._stream is not None and self._stream.world.id == world_id:
            return
        self._close_world()
        store = self._store if self.is_master else connect_store(
            master_metadata["host"], int(master_metadata["port"]), self.timeout_s)
        world = SyncWorld(world_id, store, rank, world_size, self.backend, self.timeout_s)
        self._stream = WindowStream(world, n_trainers, window_bytes=self.bucket_size,
                                    bucket_bytes=self.sync_bucket_bytes, depth=self.depth)
        self.n_trainers = n_trainers

    def finalize(self) -> None:
        """Release device caches; destroy the world only with ``rebuild_group``."""
        if self.rebuild_group:
            self._close_world()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _close_world(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None

    # ---- weights ----------------------------------------------------------------------------

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
        stream = self._joined("send_weights")
        stream.window_bytes, stream.bucket_bytes = self.bucket_size, self.sync_bucket_bytes  # the engine's, now
        sharded = _is_sharded(weights)
        metrics = stream.send(_shard_items(weights) if sharded else iter(weights), sharded=sharded)
        return {f"rollmux_sync/{k}": v for k, v in metrics.items()}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        """Receive full parameters, window by window, and yield them as ``(name, tensor)``.

        Each window's tensors are fresh buffers, so a consumer may keep them.

        Raises:
            SyncError: this worker is not a rollout rank of the sync world.
        """
        stream = self._joined("receive_weights")
        out = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        for window in stream.receive():
            for name, b in window:
                yield name, (b if out is None or b.device == out else b.to(out, non_blocking=True))

    def _joined(self, call: str) -> WindowStream:
        if self._stream is None:
            raise SyncError(f"{call} before init_process_group: CheckpointEngineManager.build_process_group "
                            "must run first (veRL's update_weights does)")
        return self._stream


# ---- helpers ----------------------------------------------------------------------------------


def _transport(name: str) -> str:
    try:
        return transport(name)
    except ValueError as exc:
        raise CheckpointEngineConfigError(f"{OPTION_PREFIX}.{exc}") from None


def _positive(field: str, value: Any, *, number: bool = False) -> None:
    kinds = (int, float) if number else (int,)
    if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
        raise CheckpointEngineConfigError(f"{field}={value!r} must be a positive {'number' if number else 'integer'}")


def shared_gpus(metadata: list[dict]) -> dict[str, list[int]]:
    """GPUs that more than one sync rank reported (``prepare``'s ``gpu``), with the ranks on each. Pure."""
    ranks: dict[str, list[int]] = {}
    for i, m in enumerate(metadata):
        gpu = m.get("gpu") if isinstance(m, dict) else None
        if gpu:
            ranks.setdefault(str(gpu), []).append(i)
    return {gpu: rs for gpu, rs in ranks.items() if len(rs) > 1}


def _refuse_shared_gpus(metadata: list[dict]) -> None:
    shared = shared_gpus(metadata)
    if shared:
        listed = "; ".join(f"ranks {rs} on GPU {gpu}" for gpu, rs in shared.items())
        raise CheckpointEngineConfigError(
            f"the rollmux checkpoint-engine backend over NCCL found several sync ranks on one GPU ({listed}): "
            "the job is co-located (trainer and rollout share GPUs) and NCCL cannot connect two ranks on one "
            "GPU. Use veRL's 'naive' backend for a co-located job (it updates the replicas in place), or set "
            f"{OPTION_PREFIX}.transport=gloo")


def _gpu_identity() -> str | None:
    """This worker's GPU as ``<node>/<device uuid>`` (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return gpu_identity(_node_ip(), str(uuid) if uuid else None, os.environ.get("CUDA_VISIBLE_DEVICES"), index)


def gpu_identity(node: str, uuid: str | None, visible_devices: str | None, index: int) -> str | None:
    """A GPU's node-wide name, ``<node>/<id>``; None when it cannot be told. Pure.

    Ray gives each worker its GPUs through ``CUDA_VISIBLE_DEVICES``, so every worker's current device
    is 0: the index alone names no GPU. The device UUID does; without one, the ``CUDA_VISIBLE_DEVICES``
    entry the index points at (a physical index or a UUID); the index itself only when nothing
    narrows what the process sees.
    """
    if uuid:
        return f"{node}/{uuid}"
    if visible_devices is None:
        return f"{node}/{index}"
    entries = [e.strip() for e in visible_devices.split(",") if e.strip()]
    return f"{node}/{entries[index]}" if 0 <= index < len(entries) else None


def _node_ip() -> str:
    return ray.util.get_node_ip_address().strip("[]") if ray.is_initialized() else "127.0.0.1"


def _is_sharded(weights: Any) -> bool:
    return hasattr(weights, "get_per_tensor_param_shard")


def _shard_items(engine: Any) -> Any:
    gen, _peft = engine.get_per_tensor_param_shard()
    return iter(gen)
