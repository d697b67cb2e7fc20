"""Run the real ROLL ``AgenticPipeline.run()`` (FrozenLake, one env) for a few steps on CPU.

    PYTHONPATH=<this folder> .venv-roll/bin/python run_agentic.py --assets DIR --workdir DIR --out OUT.json [--steps 2]

Same tiny model and stand-ins as ``run_rlvr.py``. Actions come from ROLL's "random" LLM proxy (the
hf_infer worker has no request path); actor_infer is still built, offloaded, reloaded and updated
every step, and actor_train runs for real. No reference model (KL coefficient 0), as in ``run_rlvr.py``:
one process fewer per job. Same command line as ``run_rlvr.py`` (``--start-file`` included). Each step's
trajectory groups (episode ids and loop seeds) go to ``WORKDIR/trajectories.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

AGENT_TEMPLATE = ("Observation:\n{observation}\nUse format '<answer>Right</answer>'. You have {actions_left} actions "
                  "left.\nDecide the next action:\n")


def agentic_config(assets: Path, out: Path, steps: int, name: str, lr: float) -> dict[str, Any]:
    model = str(assets / "model")
    args = {"dtype": "fp32", "attn_implementation": "sdpa", "disable_gradient_checkpointing": True}

    def cluster(**extra: Any) -> dict[str, Any]:
        return {"model_args": dict(args), "data_args": {"template": "native"}, "device_mapping": "[0]",
                "infer_batch_size": 1, **extra}

    env_manager = {"num_env_groups": 1, "group_size": 1, "max_env_num_per_worker": 1, "tags": ["FrozenLake"],
                   "num_groups_partition": [1], "llm_proxy": {"proxy_type": "random"}}
    return {
        "exp_name": name, "seed": 42, "output_dir": str(out / "output"), "logging_dir": str(out / "logs"),
        "render_save_dir": str(out / "render"), "track_with": "stdout",
        "checkpoint_config": {"type": "file_system", "output_dir": str(out / "ckpt")},
        "max_steps": steps, "save_steps": 10_000, "logging_steps": 1, "eval_steps": 10_000,
        "rollout_batch_size": 1, "val_batch_size": 1, "sequence_length": 2048, "reward_clip": 20,
        "advantage_clip": 10.0, "ppo_epochs": 1, "adv_estimator": "reinforce", "init_kl_coef": 0.0,
        "whiten_advantages": False, "entropy_loss_coef": 0.01, "pretrain": model, "reward_pretrain": model,
        "num_gpus_per_node": 1, "model_update_buffer_size_mb": 16,
        "actor_train": cluster(training_args={"learning_rate": lr, "weight_decay": 0, "per_device_train_batch_size": 1,
                                              "gradient_accumulation_steps": 1, "warmup_steps": 0},
                               strategy_args={"strategy_name": "fsdp2_train", "strategy_config": {}}),
        "actor_infer": cluster(generating_args={"max_new_tokens": 4, "num_beams": 1, "do_sample": False,
                                                "num_return_sequences": 1},
                               strategy_args={"strategy_name": "vllm", "strategy_config": {}}),
        "reference": cluster(strategy_args={"strategy_name": "hf_infer", "strategy_config": None}),
        "enable_response_mask": True, "action_sep": "||", "use_turn_scores": False, "enable_think": False,
        "max_actions_per_traj": 1, "reward_normalization": {"grouping": "tags", "method": "identity"},
        "custom_envs": {"FrozenLake": {
            "env_type": "frozen_lake", "max_steps": 1, "max_tokens_per_step": 16,
            "agent_system_template": "You're a helpful assistant. You are a good game player.",
            "agent_template": AGENT_TEMPLATE,
            "env_instruction": "You are solving the FrozenLake puzzle. The answer must be one action in a turn, "
                               "format is <answer>Right</answer>",
            "env_config": {"action_pattern": "<answer>(.*?)</answer>", "max_steps": 1, "format_penalty": -0.001,
                           "size": 4, "is_slippery": False}}},
        "train_env_manager": {"format_penalty": -0.001, **env_manager},
        "val_env_manager": dict(env_manager),
    }


def build(args: argparse.Namespace) -> Any:
    import dacite
    from roll.pipeline.agentic.agentic_config import AgenticConfig

    cfg = dacite.from_dict(AgenticConfig, agentic_config(Path(args.assets), Path(args.workdir), args.steps, args.name,
                                                         args.lr))
    cfg.actor_infer.strategy_args.strategy_name = "hf_infer"
    cfg.actor_infer.worker_cls = "cpu_patches.CpuInferWorker"
    return cfg


TRAJECTORIES = "trajectories.jsonl"
"""In the job's workdir: one line per rollout (train, and val at step 0), the ``traj_group_id``s
(``<tag>_<group>_<episode>_<seed>``) of its batch, appended as it returns (a restarted run appends to the same file)."""


def record_trajectories(module: Any, path: Path) -> None:
    """Wrap ``dump_rollout_trajectories(path, global_step, batch)``, which ``AgenticPipeline.run`` calls once
    per step with the step's batch (and from ``val`` in its executor thread with the val batch): append the batch's
trajectory groups to `path` first."""
    import json
    import threading

    original = module.dump_rollout_trajectories

    def dump(dump_dir: Any, global_step: int, batch: Any) -> Any:
        groups = sorted(set(batch.non_tensor_batch["traj_group_id"].tolist()))
        mode = "train" if threading.current_thread() is threading.main_thread() else "val"  # val: executor thread
        with path.open("a") as f:
            f.write(json.dumps({"step": int(global_step), "mode": mode, "traj_group_ids": groups}) + "\n")
        return original(dump_dir, global_step, batch)

    module.dump_rollout_trajectories = dump


def _agentic_pipeline(workdir: Path) -> type:
    from roll.pipeline.agentic import agentic_pipeline

    record_trajectories(agentic_pipeline, workdir / TRAJECTORIES)
    return agentic_pipeline.AgenticPipeline


def main() -> int:
    sys.path.insert(0, str(HERE))
    import assets
    from run_rlvr import parser, run_pipeline

    args = parser(__doc__, "agentic").parse_args()
    assets.build(Path(args.assets))
    return run_pipeline(args, build(args), lambda: _agentic_pipeline(Path(args.workdir)))


if __name__ == "__main__":
    sys.exit(main())
