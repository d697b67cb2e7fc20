"""The RollMux job spec of a ROLL pipeline, read from its config (no ROLL import needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollmux.adapters.common.registration import job_name, phase_times, slo
from rollmux.core.model import Deployment, JobSpec

_BYTES_PER_PARAM = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "bfloat16": 2, "float16": 2}


def _gpus(worker: Any) -> int:
    mapping = getattr(worker, "device_mapping", None)
    return max(1, len(mapping) if isinstance(mapping, (list, tuple)) else 1)


def _model_params_b(cfg: Any) -> float:
    """Billions of parameters of the local pretrained model (weights on disk / bytes per parameter);
    7.0 when the model is not a local folder (a hub name)."""
    path = Path(str(getattr(cfg, "pretrain", "") or ""))
    if not path.is_dir():
        return 7.0
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors")) or \
        sum(f.stat().st_size for f in path.glob("*.bin"))
    dtype = "fp32"
    conf = path / "config.json"
    if conf.exists():
        dtype = str(json.loads(conf.read_text()).get("torch_dtype") or dtype)
    return max(weights / _BYTES_PER_PARAM.get(dtype, 2) / 1e9, 1e-6)


def _turn_tokens(cfg: Any, env_mgr: Any) -> int:
    """Most new tokens an agentic turn generates: ROLL's env managers cap each turn at the smallest of
    the environment's ``max_tokens_per_step``, the infer worker's ``max_new_tokens`` and what is left
    of ``sequence_length`` (the whole trajectory's context, not one response)."""
    envs = getattr(cfg, "custom_envs", None) or {}
    per_step = [int(envs[t].get("max_tokens_per_step", 0) or 0) for t in (getattr(env_mgr, "tags", None) or ())
                if t in envs]
    generating = getattr(getattr(cfg, "actor_infer", None), "generating_args", None)
    caps = [max(per_step, default=0), int(getattr(generating, "max_new_tokens", 0) or 0),
            int(getattr(cfg, "sequence_length", 0) or 0)]
    return min([c for c in caps if c > 0], default=1)


def deployment(cfg: Any) -> Deployment:
    """The job's own deployment mode, fixed by its device mappings: actor_infer sharing GPUs with
    actor_train is co-located on the training pool (ROLL's default); disjoint mappings are disaggregated."""
    infer = set(getattr(getattr(cfg, "actor_infer", None), "device_mapping", None) or [])
    train = set(getattr(getattr(cfg, "actor_train", None), "device_mapping", None) or [])
    return Deployment.COLOCATED_TRAIN if infer & train else Deployment.DISAGGREGATED


def job_spec(cfg: Any, *, name: str | None = None) -> JobSpec:
    """The job as the coordinator models it: GPUs per pool, model size, tokens, batch, turns, and its
    deployment mode (ROLL builds its clusters from the config, so the mode is the job's, not chosen).

    Phase times are ``ROLLMUX_PHASE_S`` when set, else left to the coordinator's profiler; the
    measured ones refine them as the job runs. The job's name is `name` when given (a relocated job's
    restart: the name in its marker), else ``ROLLMUX_JOB``, else ROLL's ``exp_name`` plus a unique suffix.
    """
    infer, train = getattr(cfg, "actor_infer", None), getattr(cfg, "actor_train", None)
    samples = int(getattr(cfg, "num_return_sequences_in_group", 1) or 1)
    batch = int(getattr(cfg, "rollout_batch_size", 0) or 0) * samples
    env_mgr = getattr(cfg, "train_env_manager", None)
    turns = int(getattr(cfg, "max_actions_per_traj", 0) or 0) if env_mgr is not None else 1
    max_tokens = _turn_tokens(cfg, env_mgr) if env_mgr is not None else \
        int(getattr(cfg, "response_length", 0) or getattr(cfg, "sequence_length", 0) or 1)
    t_roll, t_train = phase_times()
    return JobSpec(name=name or job_name(str(getattr(cfg, "exp_name", "") or "roll")), n_rollout_gpus=_gpus(infer),
                   n_train_gpus=_gpus(train), slo=slo(), model_params_b=_model_params_b(cfg),
                   max_tokens=max_tokens, batch_size=max(batch, 1), turns=max(turns, 1), t_roll_s=t_roll,
                   t_train_s=t_train, deployment=deployment(cfg))
