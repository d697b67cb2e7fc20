"""What a veRL job's GPUs hold between its phases, and what makes them free (veRL 0.9.x).

RollMux hands a job's nodes to another job between phases, so the job's GPU memory must really be
released at each phase end (the sidecar checks it at every release: the job's processes' NVML memory)
and come back warm at the next start. Between two phases a co-located (hybrid engine) job holds:

* **Trainer state** (FSDP parameters, gradients, optimizer): the runner calls veRL's worker RPC
  ``actor_rollout_wg.to("cpu")`` after each sync and ``to("device")`` before the next train phase,
  unless veRL already offloads it around each call (``fsdp_config.param_offload`` and
  ``optimizer_offload``). The host copy is what warm start reloads. veRL's engines empty the device
  cache after moving the model but not after the optimizer (``FSDPEngine.to`` offloads the model, which
  empties the cache, then the optimizer, which does not), so the optimizer's blocks would stay reserved
  in the worker: the adapter wraps the worker's ``TrainingWorker.to`` (in the worker processes, where
  the plugin loads too; veRL's ``@register`` metadata is kept, so worker groups bind it as before) and
  empties the cache after every move to the host (:func:`empties_cache_after`). Wrapping the worker
  method, not following the RPC with a second one, keeps it inside the call whose time the runner
  measures, and covers every move of a ``TrainingWorker`` (the actor's; a critic's where veRL moves it:
  the runner moves only ``actor_rollout_wg``, docs/how-to/run-verl.md lists the critic's settings).
* **Rollout engines** (the hybrid engine's replicas on the training GPUs): veRL itself puts them to
  sleep at the end of every rollout (``CheckpointEngineManager.sleep_replicas``), at the level below.
  vLLM: level 2 (weights and KV cache discarded) unless the next weight push cannot restore the
  weights (LoRA served as an adapter, an MTP drafter at rollout, Ascend NPU): level 1, weights kept in
  host memory. SGLang: ``release_memory_occupation`` of KV cache and weights (KV cache only for a LoRA
  adapter). Level 2 keeps what warm start needs: every rollout of a hybrid job begins with the
  trainer's full weight push (``update_weights``, ``naive`` backend), so a host copy of the rollout
  weights would be overwritten unread, and the trainer's offloaded state already is the host copy.
* **The weight push** (``naive`` backend, co-located): veRL's worker ``update_weights`` resumes the
  engine's weights, pushes the trainer's, then resumes the KV cache, so an engine pushed at the end of
  Sync holds its whole ``gpu_memory_utilization`` share until the next rollout, while other jobs hold
  the node. The adapter defers that push to the next Rollout's permit (:func:`push_timing`): at Sync
  it is recorded, not run (veRL's naive path returns no metrics, so the trainer sees the same result);
  once the next Rollout is granted the runner reloads the trainer's model to the device, runs veRL's own
  ``update_weights`` with the arguments the trainer gave, offloads the model again
  (:func:`deferred_push_steps`), and generation starts. The weights pushed are the ones Sync(i) would
  have pushed (nothing trains in between), so on-policy order and the per-step metrics are a solo
  run's. The alternative, putting the engines to sleep after the push at a level that keeps a host copy
  of the weights, is not available: veRL's server picks the level itself (``_resolve_sleep_level``,
  2 for full weights) and would discard what was just pushed. A push that opens a rollout (the first
  one, a critic warm-up's, a validation's wake-up) runs where veRL calls it, inside that rollout. If
  the job ends after Sync, the deferred push is dropped: no rollout would read it. Other backends
  (``nccl``, ``rollmux``) serve disaggregated rollouts, whose engines are not on the Sync permit's nodes.
* ``rollout.free_cache_engine=False`` makes veRL skip that sleep (the engine keeps its weights and KV
  cache on the GPU for the whole run): opted in, the driver turns it back on.

Pure functions over the job's config and the phase; no Ray, no GPU, no veRL import.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rollmux.adapters.verl.spec import get

log = logging.getLogger(__name__)

VLLM_KEEPS_WEIGHTS, VLLM_DISCARDS_WEIGHTS = 1, 2
"""vLLM sleep levels: 1 offloads the weights to host memory, 2 discards them (both free the KV cache)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepPlan:
    """How the job's rollout engine frees the GPU at the end of each rollout phase."""

    engine: str  # actor_rollout_ref.rollout.name (vllm, sglang, ...)
    level: int | None  # vLLM sleep level (1 or 2); None for other engines
    released: tuple[str, ...]  # what sleeping frees on the GPU ("kv_cache", "weights")
    weights_from: str  # where the next rollout's weights come from
    frees_gpu: bool  # False: veRL will not sleep the engine (free_cache_engine off)


def lora_as_adapter(cfg: Any) -> bool:
    """LoRA served as an adapter (not merged): veRL's ``vLLMHttpServer.lora_as_adapter``, on the config."""
    rank = int(get(cfg, "actor_rollout_ref.model.lora_rank", 0) or 0) or \
        int(get(cfg, "actor_rollout_ref.model.lora.rank", 0) or 0)
    return rank > 0 and not bool(get(cfg, "actor_rollout_ref.model.lora.merge", False))


def _mtp_rollout(cfg: Any) -> bool:
    return bool(get(cfg, "actor_rollout_ref.model.mtp.enable", False)) and \
        bool(get(cfg, "actor_rollout_ref.model.mtp.enable_rollout", False))


def sleep_plan(cfg: Any) -> SleepPlan:
    """The rollout engine's sleep between phases, as veRL 0.9 will run it for this config (hybrid engine).

    vLLM's level follows ``vLLMHttpServer._resolve_sleep_level``: 1 for a LoRA adapter, an MTP drafter
    at rollout or an NPU, else 2.
    """
    engine = str(get(cfg, "actor_rollout_ref.rollout.name", "vllm"))
    frees = bool(get(cfg, "actor_rollout_ref.rollout.free_cache_engine", True))
    adapter = lora_as_adapter(cfg)
    keep = adapter or _mtp_rollout(cfg) or str(get(cfg, "trainer.device", "cuda")) == "npu"
    level: int | None = None
    if engine == "vllm":
        level = VLLM_KEEPS_WEIGHTS if keep else VLLM_DISCARDS_WEIGHTS
        released = ("kv_cache", "weights")  # level 1 moves the weights to host memory, level 2 drops them
        weights_from = "host copy (sleep level 1)" if keep else "trainer's weight push at the rollout's start"
    elif adapter:
        released, weights_from = ("kv_cache",), "kept on the GPU (LoRA adapter)"
    else:
        released, weights_from = ("kv_cache", "weights"), "trainer's weight push at the rollout's start"
    return SleepPlan(engine=engine, level=level, released=released if frees else (), weights_from=weights_from,
                     frees_gpu=frees)


def ensure_memory_freed(cfg: Any) -> list[str]:
    """Turn on veRL's own release of the rollout engine's memory between phases; returns what changed.

    Called by the driver before veRL hands the config to its TaskRunner (opted-in jobs only).
    """
    rollout = get(cfg, "actor_rollout_ref.rollout")
    if rollout is None or bool(get(rollout, "free_cache_engine", True)):
        return []
    rollout["free_cache_engine"] = True
    log.warning("RollMux: actor_rollout_ref.rollout.free_cache_engine=True (with False, veRL never puts the "
                "rollout engine to sleep and its GPU memory stays taken while other jobs hold the node)")
    return ["actor_rollout_ref.rollout.free_cache_engine=True"]


NAIVE_BACKEND = "naive"
"""veRL's in-process weight push between a trainer worker and its co-located rollout engine."""


class PushTiming(str, Enum):
    """When the trainer's weight push into the rollout engines runs."""

    NOW = "now"  # where the trainer calls update_weights
    NEXT_ROLLOUT = "next_rollout"  # recorded at Sync, run once the next Rollout is granted


def push_timing(*, backend: str, phase: str | None) -> PushTiming:
    """When to run a weight push the trainer asks for.

    Args:
        backend: ``actor_rollout_ref.rollout.checkpoint_engine.backend`` (``CheckpointEngineManager.backend``).
        phase: the job's phase the push falls in (``rollout``, ``sync``; None when no phase is gated).

    Returns:
        NEXT_ROLLOUT for a ``naive`` push at Sync (it would wake the co-located engine, KV cache
        included, until the next rollout); NOW otherwise (a push that opens a rollout, another backend,
        a process that gates nothing).
    """
    return PushTiming.NEXT_ROLLOUT if backend == NAIVE_BACKEND and phase == "sync" else PushTiming.NOW


class PushStep(str, Enum):
    """One step of a deferred weight push, run at the start of the next Rollout."""

    RELOAD_MODEL = "reload_model"  # actor workers' to("device", model only): the state Sync left on the host
    PUSH = "push"  # veRL's own update_weights, as the trainer called it (wakes the engine)
    OFFLOAD_MODEL = "offload_model"  # to("cpu", model only): the trainer's model leaves during the rollout


def deferred_push_steps(*, runner_moves_state: bool) -> tuple[PushStep, ...]:
    """The steps of a deferred push.

    Args:
        runner_moves_state: the runner offloads the trainer state between phases (False when veRL offloads
            it around each call, as its naive push then does itself, or there is no worker group to move).

    Returns:
        The push alone, or framed by reloading the trainer's model (where veRL's push expects it, as after
        a train phase) and offloading it again.
    """
    if not runner_moves_state:
        return (PushStep.PUSH,)
    return (PushStep.RELOAD_MODEL, PushStep.PUSH, PushStep.OFFLOAD_MODEL)


def empties_cache_after(device: str) -> bool:
    """Whether a worker empties its device cache after veRL's ``to(device)`` (every move to the host)."""
    return device == "cpu"
