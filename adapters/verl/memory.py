"""What a veRL job's GPUs hold between its phases, and the settings that make them free (veRL 0.9.x).

RollMux hands a job's nodes to another job between phases, so the job's GPU memory must really be
released at each phase end and come back warm at the next start:

* **Trainer state** (FSDP parameters, gradients, optimizer): the runner calls veRL's worker RPC
  ``actor_rollout_wg.to("cpu")`` after each sync and ``to("device")`` before the next train phase,
  unless veRL already offloads it around each call (``fsdp_config.param_offload`` and
  ``optimizer_offload``). The host copy is what warm start reloads.
* **Rollout engines** (the hybrid engine's replicas on the training GPUs): veRL itself puts them to
  sleep at the end of every rollout (``CheckpointEngineManager.sleep_replicas``), at the level below.
  vLLM: level 2 (weights and KV cache discarded) unless the next weight push cannot restore the
  weights (LoRA served as an adapter, an MTP drafter at rollout, Ascend NPU): level 1, weights kept in
  host memory. SGLang: ``release_memory_occupation`` of KV cache and weights (KV cache only for a LoRA
  adapter). Level 2 keeps what warm start needs: every rollout of a hybrid job begins with the
  trainer's full weight push (``update_weights``, ``naive`` backend), so a host copy of the rollout
  weights would be overwritten unread, and the trainer's offloaded state already is the host copy.
* ``rollout.free_cache_engine=False`` makes veRL skip that sleep (the engine keeps its weights and KV
  cache on the GPU for the whole run): opted in, the driver turns it back on.

Pure functions over the job's config; no Ray, no GPU, no veRL import.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
        weights_from = "host copy (sleep level 1)" if keep else "trainer's weight push at sync"
    elif adapter:
        released, weights_from = ("kv_cache",), "kept on the GPU (LoRA adapter)"
    else:
        released, weights_from = ("kv_cache", "weights"), "trainer's weight push at sync"
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
