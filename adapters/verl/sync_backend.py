"""Registers the ``rollmux`` checkpoint-engine backend with veRL when the adapter is active.

The backend module imports veRL and torch, so it is imported from a post-import hook on
``verl.checkpoint_engine`` (whose ``CheckpointEngineRegistry`` it joins), never from the plugin
entry point, which runs while ``verl`` is half-imported. A job that is not opted in can still pick
the backend through veRL's own ``checkpoint_engine.custom_backend_module`` option.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rollmux.adapters.common import hooks

ENGINE_MODULE = "rollmux.adapters.verl.checkpoint_engine"
"""Importing it registers the backend (``...checkpoint_engine.custom_backend_module`` takes it too)."""


def install() -> None:
    """Register the backend once ``verl.checkpoint_engine`` is imported (at once if it is). Idempotent."""
    hooks.when_imported("verl.checkpoint_engine", _register)


def _register(module: ModuleType) -> None:
    importlib.import_module(ENGINE_MODULE)
