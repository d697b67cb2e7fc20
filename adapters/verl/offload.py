"""The wrappers that carry out :mod:`.memory`'s decisions: the worker's device cache emptied after each
move to the host, and the co-located weight push deferred from Sync to the next Rollout's permit.

:func:`worker_to` runs in veRL's worker processes (``TrainingWorker.to``); :func:`update_weights` and
:func:`run_deferred_push` in the trainer loop's process (the runner's). Thin: the decisions are
:mod:`.memory`'s pure functions.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollmux.adapters.common.api import Wrapper
from rollmux.adapters.common.relocation import record
from rollmux.adapters.verl import memory
from rollmux.shim import env


@dataclass(frozen=True, slots=True, kw_only=True)
class DeferredPush:
    """A weight push the trainer asked for at Sync, run when the next Rollout is granted."""

    run: Callable[[], Any]  # veRL's own update_weights with the trainer's arguments (blocks until pushed)
    iteration: int  # the Sync it was asked for in


# ------------------------------------------------------------------------------------- worker side
def worker_to(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wraps veRL's ``TrainingWorker.to(device, model, optimizer, grad)``: after a move to the host, the
    cached blocks it freed are given back to the device (veRL empties the cache after the model only)."""
    result = wrapped(*args, **kwargs)
    device = args[0] if args else kwargs.get("device", "")
    if memory.empties_cache_after(str(device)):
        _empty_cache()
    return result


def _empty_cache() -> None:
    from verl.utils.device import get_torch_device  # a worker process: veRL is imported

    dev = get_torch_device()
    before = int(dev.memory_reserved())
    if dev.is_available():
        dev.synchronize()  # veRL's offload copies are asynchronous (non_blocking)
    dev.empty_cache()
    record("worker_cache_emptied", job=os.environ.get(env.JOB, ""), reserved_before=before,
           reserved_after=int(dev.memory_reserved()))


# ------------------------------------------------------------------------------------ trainer side
def update_weights(before: Callable[[], None], after: Callable[[], None], runner: Callable[[], Any]) -> Wrapper:
    """The wrapper of ``CheckpointEngineManager.update_weights`` (its inner coroutine): `before` opens the
    push's phase, the push runs now or is handed to the process's runner (`runner()`, None when off;
    :func:`memory.push_timing`), `after` closes the phase."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _update_weights(before, after, runner, wrapped, instance, args, kwargs)

    return wrapper


async def _update_weights(before: Callable[[], None], after: Callable[[], None], runner: Callable[[], Any],
                          wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    await asyncio.to_thread(before)  # a permit wait must not stall the event loop
    r = runner()
    phase = r.tracker.current if r is not None and not r.finished else None
    if r is not None and memory.push_timing(backend=str(getattr(instance, "backend", "")),
                                            phase=phase) is memory.PushTiming.NEXT_ROLLOUT:
        r.pending_push = DeferredPush(run=lambda: _run_now(wrapped, args, kwargs), iteration=r.tracker.iteration)
        record("push_deferred", job=r.job, iteration=r.tracker.iteration)
        result: Any = {}  # what veRL's naive push returns (no sync metrics)
    else:
        result = await wrapped(*args, **kwargs)
    await asyncio.to_thread(after)
    return result


def _run_now(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from verl.utils.ray_utils import auto_await  # veRL's own runner of its coroutines from sync code

    return auto_await(wrapped)(*args, **kwargs)


def run_deferred_push(r: Any) -> None:
    """Run runner `r`'s deferred push, if any (the Rollout it is for was just granted). Idempotent."""
    push, r.pending_push = r.pending_push, None
    if push is None:
        return
    t0 = time.perf_counter()
    steps = memory.deferred_push_steps(runner_moves_state=r.moves_state())
    for step in steps:
        if step is memory.PushStep.PUSH:
            push.run()
        else:
            device = "device" if step is memory.PushStep.RELOAD_MODEL else "cpu"
            r.trainer.actor_rollout_wg.to(device, model=True, optimizer=False, grad=False)
    record("push", job=r.job, sync_iteration=push.iteration, iteration=r.tracker.iteration,
           steps=[s.value for s in steps], seconds=round(time.perf_counter() - t0, 6))
