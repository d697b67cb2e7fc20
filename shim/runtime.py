"""The opted-in shim's state in one process: its :class:`Runtime` (the sidecar connection and
counters), the running phase's :class:`PhaseContext`, and what a revoked permit does to them.

Lease loss: when the coordinator revokes the running phase's permit (its lease expired, the job
was removed), :func:`lease_lost` says so on stderr and stops the phase by raising
:class:`~rollmux.wire.errors.LeaseLostError` in the thread running it (at its next Python
bytecode: a call blocked in C returns first); the phase then ends with :func:`lost_error`.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from rollmux.core.model import PHASE_ORDER, Lease, Migration, Relocation
from rollmux.wire.errors import LeaseLostError


@dataclass(slots=True, kw_only=True)
class PhaseContext:
    """One running phase in this rank (what ``with rollmux.phase(...) as ctx`` binds)."""

    phase: str
    iteration: int
    owner: bool  # True: this rank holds the permit; False: follower (permit held on the other pool)
    lease: Lease | None  # the permit (None for a follower)
    t_request: float  # wall time the rank asked for the permit
    t_start: float = 0.0  # wall time the phase body started (after the state reload)
    cpu_start: float = 0.0  # process CPU time at the start (phase CPU vs wall shows core contention)
    reload_s: float = 0.0  # time spent reloading registered state
    thread_id: int = 0  # the thread running the phase (stopped there on lease loss)
    lost: str = ""  # why the permit was revoked ("" = it was not)
    migration: Migration | None = None  # the long-tail migration directive for this rollout, if any
    migration_taken: bool = False  # runtime_hook has returned it


@dataclass(slots=True, kw_only=True)
class Runtime:
    """The opted-in shim's connection and counters (one per process)."""

    socket: str
    job: str
    token: str = field(repr=False)  # the job token (re-attaching after a relocation); never log it
    rank: int
    timeout_s: float
    event_log: str | None
    client: Any  # rollmux.wire.sidecar_client.SidecarClient; None once detached
    events: Any  # the Attach stream's events (the client's iterator), consumed by the watcher thread
    rank_id: str
    node_id: str
    pool: str
    deployment: str | None = None  # the job's deployment mode: which pool's rank owns each phase (phase_pool)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys((p.value for p in PHASE_ORDER), 0))
    current: PhaseContext | None = None
    cache: Any = None  # rollmux.shim.state_cache.StateCache, created by register_state
    lost: threading.Event = field(default_factory=threading.Event)  # permit revoked / job aborted
    broken: str | None = None  # why the sidecar stream ended unexpectedly
    closing: bool = False
    migrations: list[Migration] = field(default_factory=list)
    relocation: Relocation | None = None  # the job's latest relocation directive heard (rollmux.relocation)
    relocated: set[int] = field(default_factory=set)  # directive epochs this rank has acted on
    phase_lock: threading.Lock = field(default_factory=threading.Lock)  # guards `current` against the watcher


def lease_lost(rt: Runtime, epoch: int, reason: str) -> None:
    """The permit of the running phase was revoked: say so and stop the phase in its thread."""
    with rt.phase_lock:
        cur = rt.current
        if cur is None or cur.lease is None or epoch not in (0, cur.lease.epoch) or cur.lost:
            return
        cur.lost = reason
        rt.lost.set()
        print(f"rollmux: job {rt.job!r} rank {rt.rank}: the permit of {cur.phase}({cur.iteration}) epoch "
              f"{cur.lease.epoch} was revoked ({reason}); stopping the phase (fenced: its results must not be "
              "committed)", file=sys.stderr, flush=True)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(cur.thread_id), ctypes.py_object(LeaseLostError))


def lost_error(rt: Runtime, ctx: PhaseContext) -> LeaseLostError:
    """The error a revoked phase ends with: its results are fenced."""
    return LeaseLostError(f"job {rt.job!r} rank {rt.rank}: the permit of {ctx.phase}({ctx.iteration}) epoch "
                          f"{ctx.lease.epoch if ctx.lease else 0} was revoked ({ctx.lost}); the phase was stopped "
                          "and its results are fenced: do not commit them, acquire the phase again")


__all__ = ["PhaseContext", "Runtime", "lease_lost", "lost_error"]
