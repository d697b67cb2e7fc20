"""The tiny GRPO job: pure pieces in-process, and one real two-process run whose reward rises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rollmux.demo.tiny_grpo.grpo import group_advantages, grpo_loss  # noqa: E402
from rollmux.demo.tiny_grpo.job import JobConfig, parse_args  # noqa: E402
from rollmux.demo.tiny_grpo.task import BOS, EOS, PAD, SEP, reward  # noqa: E402


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ([7, 7, 7, EOS], 1.0),
        ([7, 7, 7, EOS, PAD, PAD], 1.0),
        ([7, 7, EOS], 2 / 3),  # too short
        ([7, 7, 7, 7, 7, 7, EOS], 0.5),  # too long
        ([7, 1, 7, EOS], 2 / 3),
        ([EOS], 0.0),
        ([7, 7, 7, 7, 7, 7], 0.5),  # cut at the limit without EOS
    ],
    ids=["exact", "padded", "short", "long", "one-wrong", "empty", "no-eos"],
)
def test_reward_partial_credit(response: list[int], expected: float) -> None:
    assert reward([BOS, 7, 3, SEP], response) == pytest.approx(expected)


def test_group_advantages_are_normalised_per_group() -> None:
    adv = group_advantages(torch.tensor([0.0, 1.0, 0.5, 0.5, 0.2, 0.2]), group_size=2)
    assert adv[0] < 0 < adv[1]
    assert torch.allclose(adv[2:], torch.zeros(4))  # equal rewards: no signal


def test_grpo_loss_pushes_up_positive_advantage_tokens() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    loss = grpo_loss(
        logp,
        torch.zeros(2, 3),
        torch.tensor([1.0, -1.0]),
        torch.ones(2, 3),
        kl_coef=0.1,
        ref_logp=torch.zeros(2, 3),
    )
    loss.backward()
    assert (logp.grad[0] < 0).all() and (logp.grad[1] > 0).all()


def test_cli_knobs_reach_the_config_and_are_validated() -> None:
    cfg = parse_args(["--group-size", "4", "--train-epochs", "3", "--d-model", "32", "--lr", "0.01"])
    assert (cfg.group_size, cfg.train_epochs, cfg.d_model, cfg.lr) == (4, 3, 32, 0.01)
    with pytest.raises(ValueError, match="group_size"):
        JobConfig(group_size=1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_job_reward_rises_and_phases_pass_the_hook(tmp_path: Path) -> None:
    iterations = 30
    log, phases = tmp_path / "job.jsonl", tmp_path / "phases.jsonl"
    env = {**os.environ, "TINY_GRPO_PHASE_LOG": str(phases), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rollmux.demo.tiny_grpo.job",
            "--iterations",
            str(iterations),
            "--log-file",
            str(log),
            "--phase-hook",
            "rollmux.demo.tiny_grpo.hooks:recording_hook",
        ],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=280,
    )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(iterations))
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.15, rewards
    assert any(r["resp_len_max"] > r["resp_len_mean"] + 1 for r in records)  # lengths vary, with a tail
    assert all(set(r["phase_s"]) == {"sync", "rollout", "train"} for r in records)

    seen = [json.loads(line) for line in phases.read_text().splitlines()]
    by_rank = {rank: [p["phase"] for p in seen if p["rank"] == rank] for rank in (0, 1)}
    assert by_rank[0] == ["sync", "train"] * iterations
    assert by_rank[1] == ["sync", "rollout"] * iterations


def _run_job(tmp_path: Path, name: str, *args: str) -> list[dict]:
    log = tmp_path / f"{name}.jsonl"
    subprocess.run(
        [sys.executable, "-m", "rollmux.demo.tiny_grpo.job", "--log-file", str(log), *args],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
        timeout=280,
    )
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_plugin_transport_gives_the_same_run_as_broadcast(tmp_path: Path) -> None:
    pytest.importorskip("rollmux.sync_plugin")
    args = ("--iterations", "3", "--prompts", "4", "--group-size", "4")
    broadcast = _run_job(tmp_path, "broadcast", *args)
    plugin = _run_job(tmp_path, "plugin", *args, "--sync", "plugin")
    keys = ("reward_mean", "resp_len_mean", "resp_len_max", "loss")
    assert [[r[k] for k in keys] for r in plugin] == [[r[k] for k in keys] for r in broadcast]


def test_device_knob_is_validated() -> None:
    assert parse_args(["--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(ValueError, match="device='tpu'"):
        JobConfig(device="tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["broadcast", "plugin"])
def test_job_runs_on_cuda_with_both_weight_transports(tmp_path: Path, sync: str) -> None:
    records = _run_job(tmp_path, sync, "--iterations", "2", "--prompts", "4", "--group-size", "4",
                       "--device", "cuda", "--sync", sync, "--kl-coef", "0.05")
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["loss"] == r["loss"] and 0.0 <= r["reward_mean"] <= 1.0 for r in records)  # finite, in range


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rollout_and_train_run_on_the_policys_device() -> None:
    from rollmux.demo.tiny_grpo.job import build_policy, rollout, train

    cfg = JobConfig(device="cuda", prompts=2, group_size=2, max_new_tokens=4)
    policy = build_policy(cfg)
    batch = rollout(policy, cfg, 0)
    assert batch.sample.tokens.device.type == "cuda" and batch.rewards.device.type == "cpu"
    loss = train(policy, torch.optim.Adam(policy.parameters()), batch, cfg)
    assert loss == loss
