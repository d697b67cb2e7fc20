"""Contracts shared by the framework adapters: the error type and the description of one patch.

Nothing here imports a trainer framework, grpc or torch: an adapter module is imported in every
process of an unmodified job (through the framework's plugin mechanism), opted in or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollmux.core.errors import RollMuxError

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""A thin wrapper ``(wrapped, instance, args, kwargs) -> result`` (wrapt's calling convention):
``wrapped`` is the original bound to ``instance`` (None for a plain function); for a coroutine
target the wrapper returns an awaitable."""


class AdapterError(RollMuxError):
    """An adapter cannot hook the job safely (unsupported version, a target missing, bad config).

    Raised from post-import hooks, so the import of the framework module fails and the job stops
    before it touches a GPU: running unscheduled on shared GPUs is worse than not running. The
    message names what failed and the next step (or says to unset ``ROLLMUX_SIDECAR_SOCKET``).
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchTarget:
    """One attribute to wrap, found when its module is imported.

    Example: ``PatchTarget(module="verl.checkpoint_engine.base",
    attribute="CheckpointEngineManager.update_weights", wrapper=gate_sync, inner=True)``.
    """

    module: str  # exact module name whose import triggers the patch
    attribute: str  # dotted path inside the module ("Class.method" or "function")
    wrapper: Wrapper  # (wrapped, instance, args, kwargs) -> result
    inner: bool = False  # wrap the decorated function's __wrapped__ and re-apply `redecorate` around it
    redecorate: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None  # needed with inner=True
    required: bool = True  # a missing attribute is an AdapterError (else the target is skipped)

    def __post_init__(self) -> None:
        if not self.module or not self.attribute:
            raise ValueError(f"PatchTarget needs module and attribute, got {self.module!r} / {self.attribute!r}")
        if self.inner and self.redecorate is None:
            raise ValueError(f"PatchTarget {self.dotted}: inner=True needs redecorate (the decorator to re-apply)")

    @property
    def dotted(self) -> str:
        """``module:attribute``, the name used in every message."""
        return f"{self.module}:{self.attribute}"
