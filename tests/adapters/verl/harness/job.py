"""One veRL GRPO job on the CPU harness: the exact ``python -m verl.trainer.main_ppo`` command line
(Hydra overrides from the harness reference) and its environment, plus readers for its outputs.

The job is unmodified veRL: opting it in is one variable (``ROLLMUX_SIDECAR_SOCKET``) added to its
environment; everything else here is what any CPU run of the harness needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).resolve().parent
REPO = HARNESS.parents[3]


START_FILE = "RMX_START_FILE"
"""With it set, the trainer waits before its first phase until that file exists (``rollmux_verl_cpu._start_gate``)."""
STEP_GATE = "RMX_STEP_GATE"
"""With it set (a folder), the trainer pauses after each step k until ``go-{k+1}`` exists there
(``rollmux_verl_cpu._step_gate``)."""
REPLAY_POLL_S = "RMX_REPLAY_POLL_S"
"""With it set, the v1 ``ReplayBuffer`` polls every that many seconds (``rollmux_verl_cpu._replay_poll``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerlJob:
    """Knobs of one tiny veRL job (2-3 steps)."""

    name: str  # experiment name (and ROLLMUX_JOB when opted in)
    assets: Path  # tokenizer + model + parquet files (harness.assets.build)
    workdir: Path  # logs, checkpoints, event files
    steps: int = 2  # trainer.total_training_steps
    legacy: bool = False  # trainer.use_v1=False: the legacy RayPPOTrainer
    batch: int = 4  # data.train_batch_size (prompts per step)
    response_length: int = 8
    greedy: bool = True  # top_k=1 in the harness server: deterministic rollouts
    seed: int = 0
    extra: tuple[str, ...] = ()  # more Hydra overrides
    env: dict[str, str] = field(default_factory=dict)  # more environment variables

    def overrides(self) -> list[str]:
        a = self.assets
        o = [
            "algorithm.adv_estimator=grpo",
            f"data.train_files={a / 'train.parquet'}", f"data.val_files={a / 'test.parquet'}",
            f"data.train_batch_size={self.batch}", f"data.val_batch_size={self.batch}",
            "data.max_prompt_length=32", f"data.max_response_length={self.response_length}",
            "data.dataloader_num_workers=0", "data.filter_overlong_prompts=False", f"data.seed={self.seed}",
            f"actor_rollout_ref.model.path={a}", "actor_rollout_ref.model.use_remove_padding=False",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.dtype=float32", "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={self.batch}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={self.batch}",
            "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.rollout.name=hf_cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.n=1", f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={self.batch}",
            "actor_rollout_ref.rollout.agent.num_workers=1", "actor_rollout_ref.rollout.dtype=float32",
            f"actor_rollout_ref.rollout.top_k={1 if self.greedy else -1}",
            "reward.num_workers=1", f"reward.custom_reward_function.path={HARNESS / 'toy_reward.py'}",
            "reward.custom_reward_function.name=compute_score",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console]",
            "trainer.project_name=rmx", f"trainer.experiment_name={self.name}",
            f"trainer.total_training_steps={self.steps}", "trainer.val_before_train=False", "trainer.test_freq=-1",
            "trainer.save_freq=-1", f"trainer.default_local_dir={self.workdir / 'ckpt'}",
            "+ray_kwargs.ray_init.num_gpus=1", "ray_kwargs.ray_init.num_cpus=8",
            "+ray_kwargs.ray_init.include_dashboard=False",
        ]
        if self.legacy:
            o.append("trainer.use_v1=False")
        return [*o, *self.extra]

    def environ(self, opt_in: dict[str, str] | None = None) -> dict[str, str]:
        """The job's environment: the harness variables, plus `opt_in` (the RollMux variables)."""
        e = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLMUX_", "VERL_", "RAY_ADDRESS"))}
        e.update({
            "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rollmux_verl_cpu",
            "PYTHONPATH": os.pathsep.join([str(HARNESS), str(REPO)]),
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled", "RMX_HARNESS_EVENTS": str(self.workdir / "harness.jsonl"),
            "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": self.ray_tmp(),
        })
        e.update(self.env)
        e.update(opt_in or {})
        return e

    def ray_tmp(self) -> str:
        """The job's own Ray temp folder (``RAY_TMPDIR``): short, since Ray puts sockets under it."""
        digest = hashlib.sha1(str(self.workdir.resolve()).encode()).hexdigest()[:10]
        return os.path.join(tempfile.gettempdir(), f"rmxr-{digest}")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "verl.trainer.main_ppo", *self.overrides()]

    def start(self, opt_in: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start the job (its own session, log in ``workdir/job.log``)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.makedirs(self.ray_tmp(), exist_ok=True)
        log = open(self.workdir / "job.log", "wb")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(self.command(), cwd=self.workdir, env=self.environ(opt_in), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()


_STEP = re.compile(r"step:(\d+) - (.*)$")


def step_metrics(log: Path) -> dict[int, dict[str, float]]:
    """Per-step metrics veRL's console logger printed (``step:N - key:value - ...``)."""
    out: dict[int, dict[str, float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _STEP.search(line)
        if not m:
            continue
        vals: dict[str, float] = {}
        for part in m.group(2).split(" - "):
            key, _, raw = part.rpartition(":")
            try:
                vals[key.strip()] = float(raw)
            except ValueError:
                continue
        out[int(m.group(1))] = vals
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
