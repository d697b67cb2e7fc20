"""Registers the ``rollmux`` checkpoint-engine backend with veRL when the adapter is active.

The backend module imports veRL and torch, so it is imported from a post-import hook on
``verl.checkpoint_engine`` (whose ``CheckpointEngineRegistry`` it joins), never from the plugin
entry point, which runs while ``verl`` is half-imported. A job that is not opted in can still pick
the backend through veRL's own ``checkpoint_engine.custom_backend_module`` option.

Opted in, the backend is the default for disaggregated jobs (:func:`choose_default`): veRL's own
default, ``naive``, only updates colocated (hybrid-engine) replicas in process. Chosen for a colocated
job, it is refused before the job starts: its trainer and rollout ranks share GPUs, and NCCL cannot
connect two ranks on one GPU.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from rollmux.adapters.common import hooks
from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.verl import spec as verl_spec

log = logging.getLogger(__name__)
BACKEND = "rollmux"
VERL_DEFAULT = "naive"

ENGINE_MODULE = "rollmux.adapters.verl.checkpoint_engine"
"""Importing it registers the backend (``...checkpoint_engine.custom_backend_module`` takes it too)."""


def install() -> None:
    """Register the backend once ``verl.checkpoint_engine`` is imported (at once if it is). Idempotent."""
    hooks.when_imported("verl.checkpoint_engine", _register)


def _register(module: ModuleType) -> None:
    importlib.import_module(ENGINE_MODULE)


def choose_default(config: Any) -> str | None:
    """Select the ``rollmux`` backend for a disaggregated job left on veRL's default; returns the
    backend the job uses (None: the config has no checkpoint-engine section). A backend the user
    chose (nccl, nixl, ...) is left as it is, and so is veRL's default for a colocated job.

    Raises:
        AdapterError: the ``rollmux`` backend was chosen for a colocated (hybrid-engine) job.
    """
    engine = verl_spec.get(config, "actor_rollout_ref.rollout.checkpoint_engine")
    if engine is None:
        return None
    backend = verl_spec.get(engine, "backend") or VERL_DEFAULT
    if backend == BACKEND and not verl_spec.disaggregated(config):
        raise AdapterError(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={BACKEND} on a colocated job (hybrid engine: "
            "trainer and rollout share GPUs, and NCCL cannot connect two ranks on one GPU); use "
            f"backend={VERL_DEFAULT} (veRL's in-place update), or run the job disaggregated "
            "(trainer.v1.trainer_mode=separate_async with actor_rollout_ref.rollout.nnodes > 0)")
    if backend == VERL_DEFAULT and verl_spec.disaggregated(config):
        engine["backend"] = backend = BACKEND
        log.warning("RollMux: disaggregated job: actor_rollout_ref.rollout.checkpoint_engine.backend=%s "
                    "(veRL's default %r updates colocated replicas only)", BACKEND, VERL_DEFAULT)
    return str(backend)
