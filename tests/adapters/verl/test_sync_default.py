"""Opted in, a disaggregated veRL job left on veRL's default checkpoint engine moves its weights with
the ``rollmux`` backend; a colocated job and a backend the user chose are left alone, except the
``rollmux`` backend on a colocated job, which is refused (a struct OmegaConf config, as Hydra hands it
to ``main_ppo``)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.verl.sync_backend import choose_default


def _config(backend: str, rollout_nnodes: int) -> object:
    cfg = OmegaConf.create({"actor_rollout_ref": {"hybrid_engine": rollout_nnodes == 0, "rollout": {
        "nnodes": rollout_nnodes, "n_gpus_per_node": 8, "checkpoint_engine": {"backend": backend}}},
        "trainer": {"v1": {"trainer_mode": "separate_async" if rollout_nnodes else "sync"}}})
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.mark.parametrize(("backend", "nnodes", "chosen"), [("naive", 1, "rollmux"), ("naive", 0, "naive"),
                                                           ("nccl", 1, "nccl"), ("rollmux", 1, "rollmux")])
def test_the_rollmux_backend_is_the_default_for_disaggregated_jobs(backend: str, nnodes: int, chosen: str) -> None:
    cfg = _config(backend, nnodes)
    assert choose_default(cfg) == chosen
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == chosen  # type: ignore[attr-defined]


def test_a_config_without_a_checkpoint_engine_is_left_alone() -> None:
    assert choose_default({"actor_rollout_ref": {"rollout": {}}}) is None


def test_the_rollmux_backend_is_refused_for_a_colocated_job() -> None:
    cfg = _config("rollmux", 0)
    with pytest.raises(AdapterError, match="colocated job") as err:
        choose_default(cfg)
    assert "backend=naive" in str(err.value)
