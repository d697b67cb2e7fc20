"""Weight sync of disaggregated ROLL jobs through ``rollmux.sync_plugin`` (scatter, then all-gather).

ROLL's separated ``model_update`` broadcasts every bucket from actor_train rank 0 to every
actor_infer GPU (one source, one NCCL group per sender). Opted in, a ``ModelUpdateGroup`` whose
source and target clusters share no device (a disaggregated job) uses RollMux's two-stage sync
instead: every FSDP2 trainer rank sends its own ``Shard(0)`` shards across the cut (one model copy
crosses it), the inference workers all-gather them among themselves, and each loads every window
through ROLL's own bucket loader (``strategy.update_parameter_in_bucket``, the path ROLL's
colocated update uses, so vLLM, SGLang and hf_infer load as they do there). ROLL's
``BasePipeline.model_update`` still calls ``process_weights_after_loading`` afterwards.

Kept on ROLL's path (logged once): colocated pairs, training strategies other than ``fsdp2_train``
(Megatron's TP/PP shards need its HF conversion), LoRA, and MoE models whose FSDP2 layout ROLL
converts while gathering (qwen3_moe / qwen3_next).

The driver (:func:`wrap_group_init`, :func:`wrap_group_model_update`) runs the worker side with
Ray's ``__ray_call__`` on ROLL's own actors: :func:`_serve` / :func:`_join` build the sync world once
(kept across steps), :func:`_send` runs on every trainer under ROLL's ``state_offload_manger`` (model
params loaded for the send, offloaded after, as ROLL's ``start_model_update`` does), and
:func:`_start_receive` runs the receive in a thread of each inference actor; the driver polls
:func:`_receive_state` until every window arrived.

The inference side loads under the Rollout permit, not during Sync. Sync holds the training node
only (``phase_pool``), while loading a window into a slept vLLM engine wakes its weights on the
rollout node's GPU, which another job's rollout may hold. So each received window is kept in host
memory (:class:`Staged`), ``InferWorker.process_weights_after_loading`` is deferred while windows
wait, and ``InferWorker.load_states`` (ROLL's first call once Sync ended, when the adapter already
holds the Rollout permit) loads them through ROLL's bucket loader and runs the deferred
``process_weights_after_loading`` first, in the order ROLL's own update runs them
(:func:`wrap_infer_load`, :func:`wrap_infer_finish`). The all-gather among the inference workers
still runs during Sync (with NCCL, one window's buffers on the rollout GPUs).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

SYNC_ATTR = "_rollmux_sync"
TRAIN_STRATEGIES = ("fsdp2_train",)
CONVERTED_MOE = ("qwen3_moe", "qwen3_next")
POLL_S = 0.02

_worlds: dict[str, Any] = {}  # per process: world id -> WindowStream (or the served store, before joining)
_receives: dict[str, _Receive] = {}


# ------------------------------------------------------------------------------------ driver


def fallback_reason(src: Any, tgt: Any) -> str | None:
    """Why a (src, tgt) pair stays on ROLL's own model_update (None: it uses the sync plugin)."""
    train = set(src.worker_config.device_mapping or [])
    infer = set(tgt.worker_config.device_mapping or [])
    if not train or not infer or train & infer:
        return "colocated (the clusters share devices): ROLL's CUDA-IPC update stays"
    strategy = src.worker_config.strategy_args.strategy_name
    if strategy not in TRAIN_STRATEGIES:
        return f"training strategy {strategy!r} (the sync plugin path takes {', '.join(TRAIN_STRATEGIES)})"
    if getattr(src.worker_config.model_args, "lora_target", None) is not None:
        return "LoRA adapters (ROLL adds them to the engine after the update)"
    return None


@dataclass(slots=True, kw_only=True)
class DriverSync:
    """One disaggregated pair's sync world, seen from the driver."""

    src: Any
    tgt: Any
    window_bytes: int
    timeout_s: float
    world_id: str | None = None

    def run(self) -> dict[str, float]:
        import ray

        trainers, receivers = list(self.src.workers), list(self.tgt.workers)
        if self.world_id is None:
            self.world_id = uuid.uuid4().hex[:12]
            size = len(trainers) + len(receivers)
            host, port = ray.get(trainers[0].__ray_call__.remote(_serve, self.world_id, self.timeout_s))
            ray.get([w.__ray_call__.remote(_join, self.world_id, host, port, rank, size, len(trainers),
                                           self.window_bytes, self.timeout_s)
                     for rank, w in enumerate([*trainers, *receivers])])
        start = time.perf_counter()
        ray.get([w.__ray_call__.remote(_start_receive, self.world_id) for w in receivers])
        error: BaseException | None = None
        try:
            sent = ray.get([w.__ray_call__.remote(_send, self.world_id) for w in trainers])
        except Exception as exc:  # the receivers fail with it (the window protocol tells every rank)
            error, sent = exc, []
        states = self._wait_receivers(receivers)
        if error is not None:
            raise error
        failed = [s["error"] for s in states if s["error"]]
        if failed:
            raise RuntimeError(f"rollmux weight sync: an inference worker failed to receive: {failed[0]}")
        metrics: dict[str, float] = {}
        for m in sent:
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v if k.endswith("bytes") else max(metrics.get(k, 0.0), v)
        metrics["rollmux_sync/seconds"] = time.perf_counter() - start
        metrics["rollmux_sync/windows"] = float(max((s["windows"] for s in states), default=0))
        return metrics

    def _wait_receivers(self, receivers: list[Any]) -> list[dict[str, Any]]:
        import ray

        deadline = time.monotonic() + self.timeout_s
        while True:
            states = ray.get([w.__ray_call__.remote(_receive_state, self.world_id) for w in receivers])
            if all(s["done"] for s in states):
                return states
            if time.monotonic() > deadline:
                pending = sum(not s["done"] for s in states)
                raise TimeoutError(f"rollmux weight sync: {pending} of {len(states)} inference workers still "
                                   f"receiving after {self.timeout_s:.0f} s (rpc_timeout)")
            time.sleep(POLL_S)


def wrap_group_init(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """``ModelUpdateGroup.__init__``: a disaggregated pair skips ROLL's broadcast-group set-up."""
    names = ("src_cluster", "tgt_cluster", "pipeline_config", "frequency")
    bound = dict(zip(names, args)) | kwargs
    src, tgt, cfg = bound["src_cluster"], bound["tgt_cluster"], bound["pipeline_config"]
    reason = fallback_reason(src, tgt)
    if reason is not None:
        log.info("rollmux: %s -> %s syncs through ROLL's model_update: %s", src.cluster_name, tgt.cluster_name,
                 reason)
        return wrapped(*args, **kwargs)
    instance.src_cluster, instance.tgt_cluster, instance.pipeline_config = src, tgt, cfg
    instance.frequency = bound.get("frequency", 1)
    instance.model_update_name = f"model_update/{src.cluster_name}_2_{tgt.cluster_name}"
    setattr(instance, SYNC_ATTR, DriverSync(
        src=src, tgt=tgt, window_bytes=int(cfg.model_update_buffer_size_mb) << 20,
        timeout_s=float(getattr(cfg, "rpc_timeout", None) or 600)))
    log.info("rollmux: %s -> %s syncs through the rollmux sync plugin (%d trainers -> %d inference workers)",
             src.cluster_name, tgt.cluster_name, len(src.workers), len(tgt.workers))
    return None


def wrap_group_model_update(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                            kwargs: dict[str, Any]) -> Any:
    """``ModelUpdateGroup.model_update(step)``: the sync plugin for a disaggregated pair."""
    sync: DriverSync | None = getattr(instance, SYNC_ATTR, None)
    if sync is None:
        return wrapped(*args, **kwargs)
    step = kwargs.get("step", args[0] if args else None)
    if step is not None and step % instance.frequency != 0:
        return {}
    return sync.run()


# ------------------------------------------------------------------------- worker side (Ray)


def _serve(_actor: Any, world_id: str, timeout_s: float) -> tuple[str, int]:
    """On trainer 0: serve the world's rendezvous store; returns its address."""
    import ray

    from rollmux.sync_plugin.stream import serve_store

    host = ray.util.get_node_ip_address().strip("[]")
    store = serve_store(host, timeout_s)
    _worlds[world_id] = store
    return host, int(store.port)


def _join(_actor: Any, world_id: str, host: str, port: int, rank: int, size: int, n_trainers: int,
          window_bytes: int, timeout_s: float) -> None:
    from rollmux.sync_plugin.stream import SyncWorld, WindowStream, connect_store, transport

    store = _worlds.pop(world_id) if rank == 0 else connect_store(host, port, timeout_s)
    world = SyncWorld(world_id, store, rank, size, transport("auto"), timeout_s)
    _worlds[world_id] = WindowStream(world, n_trainers, window_bytes=window_bytes)


def _send(actor: Any, world_id: str) -> dict[str, float]:
    """On a trainer: load the model params, send this rank's shards, offload (as ROLL does)."""
    from roll.utils.context_managers import state_offload_manger
    from roll.utils.offload_states import OffloadStateType

    from rollmux.sync_plugin.stream import dtensor_items

    stream = _worlds[world_id]
    strategy = actor.strategy
    metrics: dict[str, float] = {}
    with state_offload_manger(strategy=strategy, metrics=metrics, metric_infix=f"{actor.cluster_name}/model_update",
                              load_kwargs={"include": [OffloadStateType.model_params]}):
        model = strategy.unwrap_model()
        model_type = getattr(getattr(model, "config", None), "model_type", "")
        if model_type in CONVERTED_MOE:
            raise RuntimeError(f"rollmux weight sync: {model_type} needs ROLL's FSDP2 MoE weight conversion, which "
                               "the sync plugin path does not do; unset ROLLMUX_SIDECAR_SOCKET for this job")
        items = list(dtensor_items(model.named_parameters()))
        sharded = all(_one_d_shard0(spec, stream.n_trainers) for _, _, spec in items)
        if not sharded:  # another layout (HSDP, TP): send full tensors, each trainer its flat slice
            items = [(n, t.full_tensor() if hasattr(t, "full_tensor") else t) for n, t in
                     ((n, p.data) for n, p in model.named_parameters())]
        sent = stream.send(items, sharded=sharded)
    out = {f"rollmux_sync/{k}": v for k, v in sent.items()}
    out.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
    return out


def _one_d_shard0(spec: Any, n_trainers: int) -> bool:
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(spec.placements or ())
    if spec.mesh is None:
        return all(isinstance(p, Replicate) for p in placements)
    return (len(placements) == 1 and isinstance(placements[0], Shard) and placements[0].dim == 0
            and spec.mesh.ndim == 1 and spec.mesh.size() == n_trainers)


@dataclass(slots=True)
class _Receive:
    thread: threading.Thread | None = None
    windows: int = 0
    error: str | None = None
    done: bool = False


@dataclass(slots=True)
class Staged:
    """An inference worker's received windows, in host memory until its next ``load_states``."""

    windows: list[list[tuple[str, Any, Any]]] = field(default_factory=list)  # (name, host tensor, device)
    finish: bool = False  # ROLL asked for process_weights_after_loading while windows waited

    def take(self) -> tuple[list[list[tuple[str, Any, Any]]], bool]:
        windows, finish = self.windows, self.finish
        self.windows, self.finish = [], False
        return windows, finish


STAGED = Staged()
"""This process's staged windows (one inference worker per Ray actor process)."""


def _start_receive(actor: Any, world_id: str) -> None:
    """On an inference worker: receive in a thread, keeping each window in host memory (:data:`STAGED`)."""
    state = _Receive()
    _receives[world_id] = state

    def body() -> None:
        try:
            for window in _worlds[world_id].receive():
                STAGED.windows.append([(n, t.detach().to("cpu", copy=True), t.device) for n, t in window])
                state.windows += 1
        except BaseException as exc:  # reported to the driver by _receive_state
            state.error = f"{type(exc).__name__}: {exc}"
            log.exception("rollmux: weight sync receive failed")
        finally:
            state.done = True

    state.thread = threading.Thread(target=body, name="rollmux-weight-receive", daemon=True)
    state.thread.start()


async def _awaited(out: Any) -> Any:
    return await out if inspect.isawaitable(out) else out


async def load_staged(actor: Any) -> int:
    """Load the staged windows through the worker's strategy (ROLL's bucket loader, one window on the
    device at a time), then the deferred ``process_weights_after_loading``. Returns the windows loaded."""
    windows, finish = STAGED.take()
    if not windows and not finish:
        return 0
    from roll.utils.send_recv_utils import serialize_named_weights

    strategy = actor.strategy
    infer = actor.worker_config.strategy_args.strategy_name
    tp = int(getattr(actor.worker_config, "num_gpus_per_worker", 1) or 1)
    for window in windows:
        payload = serialize_named_weights([(n, t.to(device)) for n, t, device in window], infer_strategy=infer)
        await _awaited(strategy.update_parameter_in_bucket([payload] * tp, is_lora=False))
    if finish:
        await _awaited(strategy.process_weights_after_loading())
    return len(windows)


def wrap_infer_finish(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    """``InferWorker.process_weights_after_loading``: deferred to ``load_states`` while windows wait."""

    async def run() -> Any:
        if STAGED.windows:
            STAGED.finish = True
            return None
        return await wrapped(*args, **kwargs)

    return run()


def wrap_infer_load(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """``InferWorker.load_states``: load the staged weights first (under the Rollout permit)."""

    async def run() -> Any:
        await load_staged(instance)
        return await wrapped(*args, **kwargs)

    return run()


def _receive_state(_actor: Any, world_id: str) -> dict[str, Any]:
    state = _receives.get(world_id)
    if state is None:
        return {"done": True, "windows": 0, "error": "no receive was started on this worker"}
    return {"done": state.done, "windows": state.windows, "error": state.error}
