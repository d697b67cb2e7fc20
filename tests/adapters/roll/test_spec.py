"""The job spec the ROLL adapter reads from a pipeline config (pure: plain objects with ROLL's field names)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from rollmux.adapters.roll.spec import job_spec


def _workers(max_new_tokens: int) -> dict[str, NS]:
    return {"actor_infer": NS(device_mapping=[0], generating_args=NS(max_new_tokens=max_new_tokens)),
            "actor_train": NS(device_mapping=[0, 1])}


def test_an_rlvr_job_is_sized_by_its_response_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMUX_JOB", "rlvr")
    monkeypatch.delenv("ROLLMUX_PHASE_S", raising=False)
    spec = job_spec(NS(exp_name="x", rollout_batch_size=4, num_return_sequences_in_group=2, response_length=8,
                       sequence_length=512, **_workers(8)))
    assert (spec.name, spec.max_tokens, spec.batch_size, spec.turns) == ("rlvr", 8, 8, 1)
    assert (spec.n_rollout_gpus, spec.n_train_gpus, spec.t_roll_s) == (1, 2, None)


@pytest.mark.parametrize(("per_step", "max_new", "sequence", "expected"),
                         [(16, 4, 2048, 4), (16, 64, 2048, 16), (0, 0, 2048, 2048), (256, 512, 100, 100)])
def test_an_agentic_turn_is_capped_by_the_env_step_the_generation_and_the_context(
        monkeypatch: pytest.MonkeyPatch, per_step: int, max_new: int, sequence: int, expected: int) -> None:
    """ROLL's traj env manager generates min(max_tokens_per_step, max_new_tokens, room left in
    sequence_length) per turn; sequence_length alone is the trajectory's context, not a response."""
    monkeypatch.setenv("ROLLMUX_JOB", "agentic")
    envs = {"FrozenLake": {"max_tokens_per_step": per_step} if per_step else {}, "Unused": {"max_tokens_per_step": 1}}
    spec = job_spec(NS(exp_name="g", rollout_batch_size=1, sequence_length=sequence, max_actions_per_traj=3,
                       custom_envs=envs, train_env_manager=NS(tags=["FrozenLake"]), **_workers(max_new)))
    assert (spec.max_tokens, spec.turns) == (expected, 3)


def test_declared_phase_times_reach_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMUX_PHASE_S", "3,2")
    spec = job_spec(NS(exp_name="x", rollout_batch_size=4, response_length=8, **_workers(8)))
    assert (spec.t_roll_s, spec.t_train_s) == (3.0, 2.0)


@pytest.mark.parametrize(("infer", "train", "mode"), [([0], [0, 1], "colocated-train"), ([0, 1], [0, 1], "colocated-train"),
                                                       ([1], [0], "disaggregated")])
def test_the_device_mappings_fix_the_deployment_mode(infer: list[int], train: list[int], mode: str) -> None:
    """ROLL builds its clusters from the config, so the job registers its own mode as a constraint:
    actor_infer sharing a GPU with actor_train rolls out on the training pool."""
    spec = job_spec(NS(exp_name="x", rollout_batch_size=4, response_length=8,
                       actor_infer=NS(device_mapping=infer, generating_args=NS(max_new_tokens=8)),
                       actor_train=NS(device_mapping=train)))
    assert spec.deployment is not None and spec.deployment.value == mode
