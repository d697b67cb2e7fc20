"""The RollMux job spec of a veRL job, derived from its Hydra config (pure; no Ray, no GPU)."""

from __future__ import annotations

import json
import os
from typing import Any

from rollmux.core.model import Deployment, JobSpec

_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        try:
            node = node.get(part)
        except AttributeError:
            node = getattr(node, part, None)
        if node is None:
            return default
    return node


def disaggregated(cfg: Any) -> bool:
    """True when the job runs a standalone rollout pool. veRL 0.9 builds one only in the v1
    ``separate_async`` trainer (``rollout.nnodes > 0``, optionally ``hybrid_engine=False``); ``sync``,
    ``colocate_async`` and the legacy trainer roll out on the hybrid engine whatever ``rollout.nnodes`` says."""
    standalone = int(get(cfg, "actor_rollout_ref.rollout.nnodes", 0) or 0) > 0 \
        or not bool(get(cfg, "actor_rollout_ref.hybrid_engine", True))
    return standalone and trainer_mode(cfg) == "separate_async"


TRAINER_MODES = ("sync", "colocate_async")
"""``trainer.v1.trainer_mode`` values the adapter gates (the legacy ``RayPPOTrainer`` is gated too)."""


def trainer_mode(cfg: Any) -> str:
    """The trainer veRL will build: ``legacy`` (``trainer.use_v1=False``) or the v1 ``trainer_mode``."""
    if not bool(get(cfg, "trainer.use_v1", True)):
        return "legacy"
    return str(get(cfg, "trainer.v1.trainer_mode", "sync"))


def unsupported(cfg: Any) -> str | None:
    """Why the adapter cannot gate this job (None: it can). Pure; read before Ray starts.

    ``separate_async`` (veRL 0.9's only standalone-rollout trainer, also ``hybrid_engine=False``) is
    refused: its standalone replicas generate while the trainer trains (off-policy by design, so one
    permit per phase cannot cover them without changing the algorithm), and veRL never puts standalone
    replicas to sleep (``vLLMHttpServer.sleep`` skips ``RolloutMode.STANDALONE``), so their GPU memory
    would stay taken while other jobs hold the node.
    """
    mode = trainer_mode(cfg)
    if mode == "legacy" or mode in TRAINER_MODES:
        return None
    if mode == "separate_async":
        return ("trainer.v1.trainer_mode=separate_async runs its standalone rollout pool while it trains "
                "(off-policy by design) and veRL 0.9 never puts standalone replicas to sleep, so RollMux "
                "cannot give its nodes to other jobs between phases; use trainer.v1.trainer_mode=sync or "
                "colocate_async")
    return f"trainer.v1.trainer_mode={mode} is not a veRL 0.9 trainer the adapter knows ({', '.join(TRAINER_MODES)})"


def param_count(model_path: str) -> int:
    """Parameters of the model at `model_path` (its HF ``config.json``), counted on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


def _hf_dtype_bytes(model_path: str) -> int:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            hf = json.load(f)
        dtype = hf.get("torch_dtype") or hf.get("dtype")
    except (OSError, ValueError):
        dtype = None
    return _BYTES.get(str(dtype), 2)


def job_spec(cfg: Any, *, name: str, slo: float, params: int | None = None,
             phase_s: tuple[float | None, float | None] = (None, None)) -> JobSpec:
    """The spec the coordinator schedules the job by.

    Args:
        cfg: the veRL config (``DictConfig`` or nested dicts).
        name: the job's RollMux name.
        slo: max slowdown vs alone.
        params: parameter count (default: counted from ``actor_rollout_ref.model.path``).
        phase_s: solo (rollout, train) seconds the user measured (``ROLLMUX_PHASE_S``); None: estimated.
    """
    n_train = int(get(cfg, "trainer.nnodes", 1)) * int(get(cfg, "trainer.n_gpus_per_node", 1))
    if disaggregated(cfg):
        n_roll = int(get(cfg, "actor_rollout_ref.rollout.nnodes", 0) or 0) \
            * int(get(cfg, "actor_rollout_ref.rollout.n_gpus_per_node", 0) or 0) or n_train
    else:
        n_roll = n_train  # colocated (hybrid engine): rollout runs on the training GPUs
    path = str(get(cfg, "actor_rollout_ref.model.path"))
    count = params if params is not None else param_count(path)
    multi = bool(get(cfg, "actor_rollout_ref.rollout.multi_turn.enable", False))
    turns = int(get(cfg, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns", 0) or 0) if multi else 1
    weight_bytes = count * _hf_dtype_bytes(path)
    return JobSpec(
        name=name, n_rollout_gpus=max(1, n_roll), n_train_gpus=max(1, n_train), slo=slo,
        model_params_b=max(count / 1e9, 1e-6),
        max_tokens=int(get(cfg, "data.max_prompt_length", 512)) + int(get(cfg, "data.max_response_length", 512)),
        batch_size=int(get(cfg, "data.train_batch_size", 1)) * int(get(cfg, "actor_rollout_ref.rollout.n", 1)),
        turns=max(1, turns),
        rollout_state_bytes=weight_bytes,  # host copy of the rollout weights (warm start)
        train_state_bytes=count * 16,  # fp32 master weights + Adam moments + gradients
        t_roll_s=phase_s[0], t_train_s=phase_s[1],
        # veRL builds its resource pools from the config: the job's own mode is a constraint
        deployment=Deployment.DISAGGREGATED if disaggregated(cfg) else Deployment.COLOCATED_TRAIN,
    )
