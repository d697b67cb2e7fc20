"""Run the real ROLL ``RLVRPipeline.run()`` for a few steps on CPU and write its per-step metrics.

    PYTHONPATH=<this folder> .venv-roll/bin/python run_rlvr.py --assets DIR --out OUT.json [--steps 2]

A tiny local model (``assets.py``), fsdp2_train on gloo for actor_train, hf_infer for actor_infer, ROLL's
MathRuleRewardWorker and DynamicSamplingScheduler, no reference model (KL coefficient 0: one process
fewer per job); greedy decoding, so two runs of the same job give the same metrics. The CPU stand-in patches come from ``sitecustomize.py``.

Ray: opted in to RollMux (``ROLLMUX_SIDECAR_SOCKET`` set), ROLL's own ``init()`` runs and the
adapter gives the job its private Ray instance; not opted in, this script starts a private local
Ray itself (ROLL's ``init()`` would otherwise start a detached head on port 6379 or join any
cluster on the host).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def rlvr_config(assets: Path, out: Path, steps: int, name: str, lr: float = 1e-3) -> dict[str, Any]:
    """The job's ROLL config as plain data (what a user's YAML holds)."""
    model = str(assets / "model")

    def cluster(**extra: Any) -> dict[str, Any]:
        base = {"model_args": {"dtype": "fp32", "attn_implementation": "sdpa", "disable_gradient_checkpointing": True},
                "data_args": {"template": "native"}, "device_mapping": "[0]", "infer_batch_size": 2}
        base.update(extra)
        return base

    return {
        "exp_name": name, "seed": 42, "output_dir": str(out / "output"), "logging_dir": str(out / "logs"),
        "track_with": "stdout", "checkpoint_config": {"type": "file_system",
                                                                           "output_dir": str(out / "ckpt")},
        "max_steps": steps, "save_steps": 10_000, "logging_steps": 1, "eval_steps": 10_000,
        "rollout_batch_size": 4, "prompt_length": 32, "response_length": 8,
        "num_return_sequences_in_group": 1, "generate_opt_level": 0,
        "max_running_requests": 4, "ppo_epochs": 1, "adv_estimator": "reinforce", "init_kl_coef": 0.0,
        "entropy_loss_coef": 0.01, "whiten_advantages": False, "pretrain": model, "reward_pretrain": model,
        "num_gpus_per_node": 1, "model_update_buffer_size_mb": 16, "rpc_timeout": 600,
        "actor_train": cluster(
            training_args={"learning_rate": lr, "weight_decay": 0, "per_device_train_batch_size": 2,
                           "gradient_accumulation_steps": 2, "warmup_steps": 0, "num_train_epochs": 1},
            data_args={"template": "native", "file_name": [str(assets / "data" / "train.jsonl")],
                       "messages": "messages", "preprocessing_num_workers": 1,
                       "domain_interleave_probs": {"math_rule": 1.0}},
            strategy_args={"strategy_name": "fsdp2_train", "strategy_config": {}}),
        "actor_infer": cluster(
            generating_args={"max_new_tokens": 8, "do_sample": False, "num_beams": 1, "num_return_sequences": 1},
            strategy_args={"strategy_name": "vllm", "strategy_config": {}}),
        "reference": cluster(strategy_args={"strategy_name": "hf_infer", "strategy_config": None}),
        "rewards": {"math_rule": {
            "worker_cls": "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker",
            "model_args": {"model_name_or_path": model}, "data_args": {"template": "native"},
            "tag_included": ["math_rule"], "world_size": 1, "infer_batch_size": 2}},
    }


def build(args: argparse.Namespace) -> Any:
    import dacite
    from roll.pipeline.rlvr.rlvr_config import RLVRConfig

    raw = rlvr_config(Path(args.assets), Path(args.workdir), args.steps, args.name, args.lr)
    if args.nodes > 1:  # one GPU per node: actor_train and actor_infer data-parallel over `nodes` nodes
        devices = str(list(range(args.nodes)))
        raw["num_gpus_per_node"] = 1
        for name in ("actor_train", "actor_infer", "reference"):
            raw[name]["device_mapping"] = devices
        # the same 4 samples per optimizer step: 2 per rank, no accumulation
        raw["actor_train"]["training_args"]["gradient_accumulation_steps"] = max(1, 2 // args.nodes)
    if args.disaggregated:  # actor_infer on a device of its own (fake GPU 1): ROLL's separated model update
        os.environ["RMX_FAKE_GPUS"] = "2"  # before Ray starts: its workers inherit it
        raw["num_gpus_per_node"] = 2
        raw["actor_infer"]["device_mapping"] = "[1]"
    cfg = dacite.from_dict(RLVRConfig, raw)
    # ROLL's config asserts a vllm/sglang actor_infer; on CPU the same worker runs hf_infer (harness report 4.1-2).
    cfg.actor_infer.strategy_args.strategy_name = "hf_infer"
    cfg.actor_infer.worker_cls = "cpu_patches.CpuInferWorker"
    return cfg


def start_ray(address: str = "") -> None:
    """Connect to the cluster at `address`, or start a private local Ray (not opted in; opted in, the
    adapter starts it), then ROLL's ``init()``."""
    from roll.distributed.scheduler import initialize

    if address:  # an existing multi-node cluster: each raylet's environment names its node's sidecar
        import ray
        from roll.platforms import current_platform
        from roll.utils.constants import RAY_NAMESPACE

        variables = dict(current_platform.get_custom_env_vars())
        if not os.environ.get("ROLLMUX_SIDECAR_SOCKET"):  # a solo run: RollMux off in the workers too
            variables["ROLLMUX_SIDECAR_SOCKET"] = ""
        ray.init(address=address, namespace=RAY_NAMESPACE, runtime_env={"env_vars": variables})
        initialize.start_ray_cluster = lambda: False
    elif not os.environ.get("ROLLMUX_SIDECAR_SOCKET"):
        import ray
        from roll.platforms import current_platform
        from roll.utils.constants import RAY_NAMESPACE

        ray.init(address="local", namespace=RAY_NAMESPACE, include_dashboard=False, num_cpus=16,
                 num_gpus=int(os.environ.get("RMX_FAKE_GPUS", "1")),
                 runtime_env={"env_vars": current_platform.get_custom_env_vars()})
        initialize.start_ray_cluster = lambda: False
    initialize.init()


def _probe(_actor: object) -> dict[str, object]:
    """Runs inside a Ray actor: which RollMux patches that process holds, its pid and its Ray node's labels."""
    import sys

    import ray

    mod = sys.modules.get("rollmux.adapters.roll")
    return {"loaded": mod is not None, "applied": list(mod.applied()) if mod is not None else [],
            "pid": os.getpid(), "labels": dict(ray.get_runtime_context().get_node_labels() or {})}


def worker_patches(pipeline: object) -> dict[str, object]:
    """RollMux patches in every ROLL worker process of the pipeline (cluster name/rank -> probe)."""
    import ray

    clusters = [getattr(pipeline, n, None) for n in ("actor_train", "actor_infer", "reference", "critic")]
    clusters += list((getattr(pipeline, "rewards", None) or {}).values())
    refs = {}
    for cluster in clusters:
        for rank, worker in enumerate(getattr(cluster, "workers", None) or []):
            refs[f"{cluster.cluster_name}/{rank}"] = worker.__ray_call__.remote(_probe)
    for domain, sched in (getattr(pipeline, "generate_schedulers", None) or {}).items():
        refs[f"scheduler/{domain}"] = sched.__ray_call__.remote(_probe)
    for attr in ("train_rollout_scheduler", "val_rollout_scheduler"):  # AgenticPipeline
        sched = getattr(pipeline, attr, None)
        if sched is not None:
            refs[f"scheduler/{attr}"] = sched.__ray_call__.remote(_probe)
    out: dict[str, object] = {}
    for k, ref in refs.items():
        try:
            out[k] = ray.get(ref, timeout=60)
        except Exception as exc:  # an actor ROLL already shut down
            out[k] = {"error": type(exc).__name__}
    return out


def _digests(actor: Any, side: str) -> dict[str, str]:
    """Runs inside a Ray actor: sha256 of every parameter's full bytes (trainer: all-gathered)."""
    import hashlib

    import torch

    model = actor.strategy.unwrap_model() if side == "train" else actor.strategy.model
    out = {}
    for name, p in model.named_parameters():
        t = p.data.full_tensor() if hasattr(p.data, "full_tensor") else p.data
        out[name] = hashlib.sha256(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                                   ).hexdigest()
    return out


def _nudge(actor: Any) -> None:
    """Runs inside a trainer: add 1e-3 to every local shard (new weights no sync has delivered yet)."""
    import torch

    with torch.no_grad():
        for _, p in actor.strategy.unwrap_model().named_parameters():
            local = p.data.to_local() if hasattr(p.data, "to_local") else p.data
            local.add_(1e-3)


def weight_digests(pipeline: Any) -> dict[str, Any]:
    """Sync once more (as a step would), then digest both sides: equal when the update delivered."""
    import ray

    def infer() -> list[dict[str, str]]:
        return ray.get([w.__ray_call__.remote(_digests, "infer") for w in pipeline.actor_infer.workers])

    ray.get([w.__ray_call__.remote(_nudge) for w in pipeline.actor_train.workers])  # the sync must carry these
    before = infer()
    metrics = pipeline.model_update(pipeline.pipeline_config.max_steps)
    after_sync = infer()
    pipeline.actor_infer.load_states()  # what the next step runs first under its Rollout permit
    train = ray.get([w.__ray_call__.remote(_digests, "train") for w in pipeline.actor_train.workers])
    return {"train": train[0], "infer_before": before, "infer_after_sync": after_sync, "infer": infer(),
            "sync_metrics": metrics}


def wait_for_start(out: Path, start: Path, timeout_s: float = 900.0) -> None:
    """Tell the test this job is built, then wait until it says go."""
    out.with_suffix(".built").write_text(str(time.time()))
    deadline = time.monotonic() + timeout_s
    while not start.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{start} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """The command line both harness scripts take."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--assets", required=True, help="folder made by assets.py (built there when missing)")
    p.add_argument("--workdir", required=True, help="folder for ROLL's output, logs and checkpoints")
    p.add_argument("--out", required=True, help="JSON file for the per-step metrics")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--name", default=name)
    p.add_argument("--lr", type=float, default=1e-3, help="actor learning rate (tells two jobs apart)")
    p.add_argument("--start-file", help="once built, write OUT.built and wait for this file before run() "
                   "(lets a test start several jobs' first phases together)")
    p.add_argument("--ray-address", default="", help="connect to this Ray cluster (multi-node) instead of a "
                   "private local one")
    p.add_argument("--nodes", type=int, default=1, help="RLVR: actor_train and actor_infer over this many "
                   "one-GPU nodes")
    p.add_argument("--disaggregated", action="store_true", help="RLVR: actor_infer on its own (fake) device")
    p.add_argument("--check-weights", action="store_true", help="after run(), nudge actor_train's weights, sync "
                   "once more, load actor_infer's states and write digests of both sides' weights: before the sync, "
                   "after it and after the load (OUT's 'weights')")
    p.add_argument("--timing", action="store_true", help="also record the driver's spans, the seconds spent in "
                   "offload_states / load_states and (opted in) in permit calls (timing.py)")
    p.add_argument("--step-gate", help="with --timing: after each pipeline step write DIR/done-K and wait for "
                   "DIR/go-K+1 (the benchmark alternates two jobs' steps)")
    return p


def run_pipeline(args: argparse.Namespace, cfg: Any, pipeline_cls: Callable[[], type]) -> int:
    """Build the pipeline (after starting Ray), optionally wait for the start file, run it, write OUT."""
    t0 = time.time()
    start_ray(args.ray_address)
    pipeline = pipeline_cls()(pipeline_config=cfg)
    t_built = time.time()
    if args.start_file:
        wait_for_start(Path(args.out), Path(args.start_file))
    timing: dict[str, Any] = {}
    if args.timing:
        import timing as probes

        state_calls: list[list[Any]] = []
        gate = probes.step_gate(Path(args.step_gate)) if args.step_gate else None
        spans, states = probes.SpanRecorder(gate), probes.time_states(pipeline, state_calls)
    t_run = time.time()
    pipeline.run()
    t_done = time.time()
    if args.check_weights:
        timing["weights"] = weight_digests(pipeline)
    adapter = sys.modules.get("rollmux.adapters.roll")  # loaded only when opted in
    timing["progress"] = adapter.progress_log(pipeline) if adapter is not None else None
    if args.timing:
        timing |= {"spans": spans.rows(), "states_s": states, "state_calls": state_calls,
                  "permits": adapter.permit_log(pipeline) if adapter is not None else None}
    Path(args.out).write_text(json.dumps({"steps": pipeline.state.log_history, "build_s": t_built - t0,
                                          "run_s": t_done - t_run, "t_run": t_run, "t_done": t_done,
                                          "workers": worker_patches(pipeline), **timing}, default=float))
    return 0


def _rlvr_pipeline() -> type:
    from roll.pipeline.rlvr.rlvr_pipeline import RLVRPipeline

    return RLVRPipeline


def main() -> int:
    args = parser(__doc__, "rlvr").parse_args()
    sys.path.insert(0, str(HERE))
    import assets

    assets.build(Path(args.assets))
    return run_pipeline(args, build(args), _rlvr_pipeline)


if __name__ == "__main__":
    sys.exit(main())
