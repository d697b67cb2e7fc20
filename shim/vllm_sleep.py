"""Warm start for a vLLM rollout engine through its own sleep mode.

Where vLLM is the rollout engine, its allocator already parks weights in pinned host memory and
releases the GPU (``vllm/device_allocator/cumem.py``): ``sleep(level=1)`` offloads the weights and
discards the KV cache, ``wake_up()`` maps the memory back at the same addresses (so CUDA graphs stay
valid) and restores the weights. Level 2 discards the weights too and expects the trainer to push new
ones after waking. This helper drives that API behind the same state machine as
:class:`rollmux.shim.state_cache.StateCache` (``state_cache.TRANSITIONS``), with idempotent calls.

The engine must be built with sleep mode on: ``vllm.LLM(model, enable_sleep_mode=True)``. vLLM is
imported lazily (only to report its version in errors), so the sidecar never imports it.

RL pattern that avoids a peak with both weights and KV cache resident while the trainer pushes
weights: :meth:`VllmSleep.reload_weights_first` wakes ``["weights"]``, runs the weight update, then
wakes ``["kv_cache"]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rollmux.shim.state_cache import CacheState, CopyStats, Lifecycle, LifecycleHolder, StateCacheError

LEVEL_KEEPS_WEIGHTS = 1
"""vLLM sleep level that keeps a host copy of the weights (level 2 discards them)."""


class SleepModeUnavailableError(StateCacheError):
    """The engine object has no sleep/wake_up API (not vLLM, too old, or sleep mode off)."""


def vllm_version() -> str | None:
    """The installed vLLM's version, or None when vLLM is not importable."""
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


class VllmSleep(LifecycleHolder):
    """Offload/reload a vLLM engine's GPU state with ``sleep(level)`` / ``wake_up(tags)``.

    Args:
        engine: a ``vllm.LLM`` (anything with ``sleep(level=...)`` and ``wake_up(tags=...)``).
        level: sleep level; 1 (default) keeps a host copy of the weights.
        job_id: for messages and history.
        clock: nanosecond clock for the history.

    Raises:
        SleepModeUnavailableError: the engine lacks ``sleep``/``wake_up``.
        ValueError: level is not 1 or 2.
    """

    def __init__(
        self,
        engine: Any,
        *,
        level: int = LEVEL_KEEPS_WEIGHTS,
        job_id: str = "vllm",
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        missing = [name for name in ("sleep", "wake_up") if not callable(getattr(engine, name, None))]
        if missing:
            raise SleepModeUnavailableError(
                f"rollout engine {type(engine).__name__} of job {job_id!r} has no {', '.join(missing)}(); "
                f"pass a vllm.LLM built with enable_sleep_mode=True (installed vLLM: {vllm_version()})"
            )
        if level not in (1, 2):
            raise ValueError(f"vLLM sleep level={level} must be 1 (keep weights on host) or 2 (discard)")
        self.engine = engine
        self.level = level
        self.job_id = job_id
        self._lifecycle = Lifecycle(f"vLLM sleep of job {job_id!r}", clock)

    def offload(self) -> CopyStats:
        """Put the engine to sleep (idempotent). Bytes are vLLM's business and reported as 0.

        Raises:
            CacheTransitionError: an offload or reload is already running.
        """
        if self.state is CacheState.OFFLOADED:
            return CopyStats("offload", 0, 0.0, 0.0, 0, noop=True)
        return self._run(
            "offload",
            CacheState.OFFLOADING,
            CacheState.OFFLOADED,
            CacheState.RESIDENT,
            lambda: self.engine.sleep(level=self.level),
        )

    def reload(self) -> CopyStats:
        """Wake the whole engine up (idempotent).

        Raises:
            CacheTransitionError: an offload or reload is already running.
        """
        if self.state is CacheState.RESIDENT:
            return CopyStats("reload", 0, 0.0, 0.0, 0, noop=True)
        return self._run(
            "reload",
            CacheState.LOADING,
            CacheState.RESIDENT,
            CacheState.OFFLOADED,
            lambda: self.engine.wake_up(tags=None),
        )

    def reload_weights_first(self, update_weights: Callable[[], object]) -> CopyStats:
        """Wake the weights, run ``update_weights`` (the sync), then wake the KV cache.

        Keeps the weight update from competing with the KV cache for GPU memory.

        Raises:
            CacheTransitionError: an offload or reload is already running.
        """
        if self.state is CacheState.RESIDENT:
            update_weights()
            return CopyStats("reload", 0, 0.0, 0.0, 0, noop=True)

        def staged() -> None:
            self.engine.wake_up(tags=["weights"])
            update_weights()
            self.engine.wake_up(tags=["kv_cache"])

        return self._run("reload", CacheState.LOADING, CacheState.RESIDENT, CacheState.OFFLOADED, staged)

    def _run(
        self,
        direction: str,
        during: CacheState,
        done: CacheState,
        rollback: CacheState,
        call: Callable[[], object],
    ) -> CopyStats:
        start = time.perf_counter()
        self._lifecycle.transition(during)
        try:
            call()
        except BaseException as exc:
            # vLLM rolls its own allocations back on a failed wake_up; our state follows.
            self._lifecycle.transition(rollback, f"{direction} failed: {exc!r}")
            raise
        self._lifecycle.transition(done, f"level {self.level}")
        elapsed = time.perf_counter() - start
        return CopyStats(direction, 0, elapsed, elapsed, 0)
