"""The shim's phase tracking: enter a phase (take the permit or follow it, reload the registered
state), take it off the lease watcher's hands, and end it (offload, release with the measured
duration, append the phase record to the event log).

A phase whose pool is not this rank's node pool (the rollout worker's side of ``sync``, whose
permit holds the training node) runs as a *follower*: no permit of its own, its state is loaded
for the phase, and the collective it takes part in pairs it with the permit holder.
"""

from __future__ import annotations

import json
import os
import threading
import time

from rollmux.core.model import Phase
from rollmux.shim.pools import phase_pool
from rollmux.shim.runtime import PhaseContext, Runtime, lost_error
from rollmux.shim.transport import call
from rollmux.wire.errors import LeaseLostError, RankLeaseError


def enter_phase(rt: Runtime, name: str, iteration: int | None) -> PhaseContext:
    """Start phase `name` of `iteration` (None: this rank's count of `name`): take the permit if this
    rank's pool owns the phase, else follow; reload the registered state.

    Raises:
        RankLeaseError: a phase is running already (phases do not nest), or the sidecar refused.
        PermitWaitTimeoutError, JobAbortedError, SidecarUnreachableError: as :func:`~rollmux.shim.transport.call` says.
    """
    if rt.current is not None:
        raise RankLeaseError(f"rollmux.phase({name!r}) entered inside phase {rt.current.phase!r}: phases do "
                             "not nest; end the first one before starting the next")
    it = rt.counters[name] if iteration is None else iteration
    owner = phase_pool(name, rt.deployment) == rt.pool
    ctx = PhaseContext(phase=name, iteration=it, owner=owner, lease=None, t_request=time.time())
    if owner:
        ctx.lease = call(rt, "Acquire", rt.client.acquire, rt.rank_id, Phase(name), it, rt.timeout_s,
                         timeout_s=rt.timeout_s + 30.0)
    rt.lost.clear()
    t0 = time.time()
    if rt.cache is not None:
        rt.cache.reload()
    ctx.t_start = time.time()
    ctx.cpu_start = time.process_time()
    ctx.reload_s = ctx.t_start - t0
    ctx.thread_id = threading.get_ident()
    rt.current = ctx
    return ctx


def leave_phase(rt: Runtime) -> PhaseContext | None:
    """Take the running phase off the watcher's hands; a stop it already sent lands here, not later."""
    while True:
        try:
            with rt.phase_lock:
                ctx, rt.current = rt.current, None
            return ctx
        except LeaseLostError:
            continue  # the watcher's stop arrived as the phase ended: it is recorded on ctx.lost


def exit_phase(rt: Runtime, ctx: PhaseContext) -> None:
    """End the phase: offload its state, release its permit (unless it was revoked: then raise)."""
    t_body = time.time()
    cpu_s = time.process_time() - ctx.cpu_start
    host_bytes = 0
    if rt.cache is not None:
        rt.cache.offload()
        host_bytes = int(rt.cache.host_bytes())
    t_end = time.time()
    if ctx.lost:  # fenced: the epoch is stale, nothing to release; the phase did not happen
        log_phase(rt, ctx, t_body, cpu_s, t_end)
        raise lost_error(rt, ctx)
    rt.counters[ctx.phase] = ctx.iteration + 1
    if ctx.lease is not None:
        call(rt, "Release", rt.client.release, rt.rank_id, ctx.lease.epoch,
             t_end - ctx.t_start + ctx.reload_s, host_bytes, timeout_s=rt.timeout_s + 30.0)
    log_phase(rt, ctx, t_body, cpu_s, t_end)


def log_phase(rt: Runtime, ctx: PhaseContext, t_body: float, cpu_s: float, t_end: float) -> None:
    """Append the phase's record (one JSON line) to the runtime's event log, if it has one."""
    if not rt.event_log:
        return
    rec = {"job": rt.job, "rank": rt.rank, "node": rt.node_id, "pool": rt.pool, "phase": ctx.phase,
           "iteration": ctx.iteration, "owner": ctx.owner, "epoch": ctx.lease.epoch if ctx.lease else 0,
           "t_request": round(ctx.t_request, 6), "t_start": round(ctx.t_start - ctx.reload_s, 6),
           "t_body_end": round(t_body, 6), "body_cpu_s": round(cpu_s, 6), "t_end": round(t_end, 6),
           "t_released": round(time.time(), 6)}
    if ctx.lost:
        rec["lost"] = ctx.lost  # revoked and stopped: never released, its results fenced
    fd = os.open(rt.event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


__all__ = ["enter_phase", "exit_phase", "leave_phase", "log_phase"]
