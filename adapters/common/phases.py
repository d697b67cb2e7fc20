"""Phase gating for adapters: a tracker that opens and closes the job's phases at the trainer's
boundaries, and thin ``(wrapped, instance, args, kwargs)`` wrappers that drive it.

Trainers do not run a phase inside one function: veRL's rollout starts when a batch is submitted
and ends when the replicas are put to sleep, several calls later. So a wrapper marks a *boundary*:

* :func:`begins` opens a phase before the call (a no-op when that phase is already open),
* :func:`spans` opens it before the call and closes it after,
* :func:`ends` closes it after the call (a no-op when another phase, or none, is open).

Opening a phase first closes the open one. The tracker keeps the coordinator's on-policy order
Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1) and refuses a boundary out of that order (an
adapter bug, reported as :class:`AdapterError`). Every wrapper works on sync functions and on
coroutines (a blocking permit wait then runs in a thread, so the event loop keeps serving).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollmux.adapters.common.api import AdapterError, Wrapper
from rollmux.core.model import next_phase

log = logging.getLogger(__name__)

class Gate(Protocol):
    """Where one phase's permit is taken: ``enter`` blocks until granted, ``exit`` releases it."""

    def enter(self, phase: str, iteration: int) -> Any: ...

    def exit(self, handle: Any) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseRecord:
    """One phase the tracker ran (for tests and the adapter's own timing log)."""

    phase: str  # rollout | train | sync
    iteration: int  # the job iteration it belongs to
    t_request: float  # wall time the permit was asked for
    t_start: float  # wall time it was granted
    t_release: float  # wall time the release was asked for (after the on_exit hook)
    t_end: float  # wall time it was released

    @property
    def acquire_s(self) -> float:
        """Seconds the gate took to grant the phase (permit wait plus the permit path)."""
        return self.t_start - self.t_request

    @property
    def release_s(self) -> float:
        """Seconds the gate took to release the phase."""
        return self.t_end - self.t_release


@dataclass(slots=True)
class _Open:
    phase: str
    iteration: int
    handle: Any
    t_request: float
    t_start: float


@dataclass(slots=True)
class PhaseTracker:
    """The job's phase state in the process that runs its trainer loop.

    Args:
        gate_for: the gate of each phase (e.g. the rollout rank's for "rollout").
        on_enter: called with (phase, iteration) once a phase is granted (offload/reload hooks).
        on_exit: called with (phase, iteration) before a phase is released.
        on_closed: called with each phase's record once it is released (timing logs).
        before_begin: called with (phase, iteration) before a phase's permit is asked for (the job holds
            none then: an iteration boundary when it is a Rollout); it may raise to stop the trainer.
    """

    gate_for: Callable[[str], Gate]
    on_enter: Callable[[str, int], None] | None = None
    on_exit: Callable[[str, int], None] | None = None
    on_closed: Callable[[PhaseRecord], None] | None = None
    before_begin: Callable[[str, int], None] | None = None
    history: list[PhaseRecord] = field(default_factory=list)
    _next: tuple[str, int] = ("rollout", 0)
    _open: _Open | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def current(self) -> str | None:
        """The open phase's name, or None."""
        return self._open.phase if self._open else None

    @property
    def iteration(self) -> int:
        """The iteration of the open phase, else of the next one."""
        return self._open.iteration if self._open else self._next[1]

    @property
    def upcoming(self) -> str:
        """The open phase's name, else the next phase's."""
        return self._open.phase if self._open else self._next[0]

    def resume_at(self, iteration: int) -> None:
        """Start at Rollout(`iteration`): a job restarted from its checkpoint as the same registered job
        (the coordinator kept its next phase). Only before the first phase.

        Raises:
            AdapterError: a phase was already opened, or `iteration` is negative.
        """
        with self._lock:
            if self.history or self._open is not None or iteration < 0:
                raise AdapterError(f"RollMux adapter: cannot resume at Rollout({iteration}) after "
                                   f"{len(self.history)} phases (open: {self.current})")
            self._next = ("rollout", iteration)

    def begin(self, phase: str) -> None:
        """Open `phase` (closing the open one first); a no-op when `phase` is already open.

        Raises:
            AdapterError: `phase` is not the job's next phase in on-policy order.
        """
        with self._lock:
            if self._open is not None and self._open.phase == phase:
                return
            self.end()
            if phase != self._next[0]:
                raise AdapterError(f"RollMux adapter: the trainer entered {phase!r} but the job's next phase is "
                                   f"{self._next[0]}({self._next[1]}): the trainer's call order is not one the "
                                   "adapter knows; report this with the trainer mode you run, or unset "
                                   "ROLLMUX_SIDECAR_SOCKET to run without RollMux")
            it = self._next[1]
            if self.before_begin is not None:
                self.before_begin(phase, it)
            t_request = time.time()
            handle = self.gate_for(phase).enter(phase, it)
            self._open = _Open(phase=phase, iteration=it, handle=handle, t_request=t_request, t_start=time.time())
            if self.on_enter is not None:
                self.on_enter(phase, it)

    def end(self, phase: str | None = None) -> None:
        """Close the open phase (only if it is `phase`, when given). Idempotent."""
        with self._lock:
            cur = self._open
            if cur is None or (phase is not None and cur.phase != phase):
                return
            try:
                if self.on_exit is not None:
                    self.on_exit(cur.phase, cur.iteration)
            finally:
                self._open = None
                t_release = time.time()
                self.gate_for(cur.phase).exit(cur.handle)
                nxt, nit = next_phase(cur.phase, cur.iteration)
                self._next = (nxt.value, nit)
                rec = PhaseRecord(phase=cur.phase, iteration=cur.iteration, t_request=cur.t_request,
                                  t_start=cur.t_start, t_release=t_release, t_end=time.time())
                self.history.append(rec)
                if self.on_closed is not None:
                    self.on_closed(rec)


def around(before: Callable[[], None] | None, after: Callable[[], None] | None) -> Wrapper:
    """A wrapper running `before`, the call, then `after` (also for coroutines)."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(wrapped) or inspect.iscoroutinefunction(getattr(wrapped, "func", None)):
            return _run_async(wrapped, args, kwargs, before, after)
        if before is not None:
            before()
        result = wrapped(*args, **kwargs)
        if after is not None:
            after()
        return result

    return wrapper


async def _run_async(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     before: Callable[[], None] | None, after: Callable[[], None] | None) -> Any:
    if before is not None:
        await asyncio.to_thread(before)  # a permit wait must not stall the event loop
    result = await wrapped(*args, **kwargs)
    if after is not None:
        await asyncio.to_thread(after)
    return result


def begins(tracker: Callable[[], PhaseTracker | None], phase: str) -> Wrapper:
    """Open `phase` before the call (it stays open after)."""
    return around(lambda: _each(tracker, lambda t: t.begin(phase)), None)


def spans(tracker: Callable[[], PhaseTracker | None], phase: str) -> Wrapper:
    """Open `phase` before the call and close it after (the call is the whole phase)."""
    return around(lambda: _each(tracker, lambda t: t.begin(phase)), lambda: _each(tracker, lambda t: t.end(phase)))


def ends(tracker: Callable[[], PhaseTracker | None], phase: str) -> Wrapper:
    """Close `phase` after the call, if it is the open one."""
    return around(None, lambda: _each(tracker, lambda t: t.end(phase)))


def _each(tracker: Callable[[], PhaseTracker | None], act: Callable[[PhaseTracker], None]) -> None:
    t = tracker()
    if t is not None:  # no tracker in this process (not the trainer loop's): straight through
        act(t)
