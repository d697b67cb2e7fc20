"""The in-process shim: ``rollmux.init``, ``rollmux.phase``, ``rollmux.runtime_hook``,
``rollmux.register_state`` and ``rollmux.shutdown``.

Opt-in: set ``ROLLMUX_SIDECAR_SOCKET`` (see ``rollmux.shim.env``) or pass ``socket=`` to
:func:`init`. Without it every call here returns at once: a decorated function costs one global
read and one extra Python call, and ``grpc``/``torch`` are never imported.

Opted in, a phase::

    @rollmux.phase("train")              # or: with rollmux.phase("train"):
    def train_step(...): ...

blocks until the node sidecar hands this rank the job's permit (the sidecar fans one coordinator
permit out to every local rank of the job), reloads the state registered with
:func:`register_state` from host buffers, runs, offloads the state again, and releases the permit
with the measured duration; the sidecar returns the node to the coordinator once every local rank
released and the job's GPU memory is really freed.

A phase whose pool is not this rank's node pool (the rollout worker's side of ``sync``, whose
permit holds the training node) runs as a *follower*: no permit of its own, its state is loaded
for the phase, and the collective it takes part in pairs it with the permit holder.

Lease loss: when the coordinator revokes the running phase's permit (its lease expired, the job
was removed), the shim says so on stderr and in the event log, stops the phase by raising
:class:`~rollmux.wire.errors.LeaseLostError` in the thread running it (at its next Python
bytecode: a call blocked in C returns first), offloads its state so the node's next holder finds
the GPU free, and never releases the stale epoch (it is fenced). ``with rollmux.phase(...)`` then
raises ``LeaseLostError``: do not commit that phase's results.

Long-tail migration: a directive for the running rollout (from the Attach stream or a
``runtime_hook`` answer) is kept on the phase's context (``ctx.migration``) and returned by the
next ``runtime_hook`` call.

Relocation (regrouping): a directive from the Attach stream is kept on the runtime and returned by
``rollmux.relocation()``; the job honours it at an iteration boundary with ``rollmux.relocate()``
(``rollmux.shim.relocate``).

The shim always talks to the local sidecar socket; there is no direct-to-coordinator mode.

This module is the public API and the process's opt-in state; its parts: the runtime records and
lease loss in :mod:`rollmux.shim.runtime`, the sidecar connection in
:mod:`rollmux.shim.transport`, phase entry and exit in :mod:`rollmux.shim.phases`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rollmux.core.model import PHASE_ORDER, Migration
from rollmux.shim import env, registration
from rollmux.shim.phases import enter_phase, exit_phase, leave_phase
from rollmux.shim.pools import phase_pool
from rollmux.shim.registration import JobRegistrationError, Registration, register
from rollmux.shim.runtime import PhaseContext, Runtime, lost_error
from rollmux.shim.transport import attach, call, detach
from rollmux.wire.errors import LeaseLostError, ShimConfigError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PERMIT_TIMEOUT_S = 600.0

_runtime: Runtime | None = None
_resolved = False  # the opt-in was looked at (init ran, explicitly or lazily)
_init_lock = threading.Lock()
_Runtime = Runtime  # the runtime's old name here (rollmux.shim.relocate)


# ------------------------------------------------------------------------------------------- init


def init(*, socket: str | None = None, job: str | None = None, job_token: str | None = None,
         rank: int | None = None, permit_timeout_s: float | None = None, event_log: str | None = None,
         deployment: str | None = None, connect_timeout_s: float = 15.0) -> bool:
    """Opt this process in (or not), attaching it to the node's sidecar. Idempotent.

    Every argument defaults to its environment variable (``rollmux.shim.env``); an explicit
    argument wins. Job name and token fall back to the registration this process made with
    :func:`register`, so a process that registered needs neither variable.

    Args:
        socket: the sidecar's Unix socket (``ROLLMUX_SIDECAR_SOCKET``, the opt-in).
        job: the job's registered name (``ROLLMUX_JOB``, else this process's registration).
        job_token: the job token (``ROLLMUX_JOB_TOKEN``, else this process's registration).
        rank: this process's rank in the job (``ROLLMUX_RANK``, else ``RANK``, else 0).
        permit_timeout_s: longest wait for one permit (``ROLLMUX_PERMIT_TIMEOUT_S``, else 600).
        event_log: file to append one JSON line per phase to (``ROLLMUX_EVENT_LOG``).
        deployment: the job's deployment mode (``ROLLMUX_DEPLOYMENT``, else this process's
            registration, else disaggregated): a co-located job's rank on its pool owns every phase.
        connect_timeout_s: how long to wait for the sidecar socket to accept.

    Returns:
        True when opted in and attached; False when RollMux is off (no socket configured).

    Raises:
        ShimConfigError: opted in without a job name or token.
        SidecarUnreachableError: opted in but the sidecar (or its coordinator) cannot be reached.
    """
    global _runtime, _resolved
    with _init_lock:
        path = socket if socket is not None else os.environ.get(env.SIDECAR_SOCKET, "")
        if not path:
            _resolved = True
            return False
        if _runtime is not None:
            return True
        job, token = _credentials(job, job_token)
        if not job or not token:
            missing = [n for n, v in ((env.JOB, job), (env.JOB_TOKEN, token)) if not v]
            raise ShimConfigError(f"RollMux is opted in ({env.SIDECAR_SOCKET}={path}) but {' and '.join(missing)} "
                                  "is not set and this process registered no job: register it first "
                                  "(rollmux.register(spec)), or pass the registered job's name and token "
                                  f"(rollmux.init(job=..., job_token=...)), or unset {env.SIDECAR_SOCKET} to run "
                                  "without RollMux")
        if rank is None:
            rank = int(os.environ.get(env.RANK) or os.environ.get("RANK") or 0)
        timeout = permit_timeout_s or float(os.environ.get(env.PERMIT_TIMEOUT_S) or DEFAULT_PERMIT_TIMEOUT_S)
        _runtime = attach(path, job, token, rank, timeout, event_log or os.environ.get(env.EVENT_LOG) or None,
                          connect_timeout_s, _deployment(deployment, job))
        _resolved = True
        return True


def _credentials(job: str | None, job_token: str | None) -> tuple[str, str]:
    """(job, token): explicit arguments, then the variables, then this process's registration."""
    job = job or os.environ.get(env.JOB, "")
    token = job_token or os.environ.get(env.JOB_TOKEN, "")
    reg = registration.current()
    if reg is not None and (not job or job == reg.job):
        job, token = reg.job, token or reg.token
    return job, token


def _deployment(explicit: str | None, job: str) -> str | None:
    """The job's deployment mode: the argument, then the variable, then this process's registration."""
    mode = explicit or os.environ.get(env.DEPLOYMENT) or None
    reg = registration.current()
    if mode is None and reg is not None and reg.job == job:
        mode = reg.deployment
    try:
        phase_pool("rollout", mode)
    except ValueError as exc:
        raise ShimConfigError(f"{exc} ({env.DEPLOYMENT} or rollmux.init(deployment=...))") from None
    return mode


def _active() -> Runtime | None:
    if _runtime is not None or _resolved:
        return _runtime
    init()  # lazily, from the environment
    return _runtime


# ----------------------------------------------------------------------------------------- phases


class _Phase:
    """``rollmux.phase(name)``: a context manager, and a decorator that enters it per call."""

    __slots__ = ("name", "iteration", "_ctx")

    def __init__(self, name: str, iteration: int | None) -> None:
        if name not in PHASE_ORDER:
            raise ValueError(f"rollmux.phase({name!r}): expected one of {', '.join(PHASE_ORDER)}")
        self.name, self.iteration = name, iteration
        self._ctx: PhaseContext | None = None

    def __call__(self, fn: F) -> F:
        name, iteration = self.name, self.iteration

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _runtime is None and _resolved:  # not opted in: straight through
                return fn(*args, **kwargs)
            with _Phase(name, iteration):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __enter__(self) -> PhaseContext | None:
        rt = _active()
        if rt is None:
            self._ctx = None
            return None
        try:
            self._ctx = enter_phase(rt, self.name, self.iteration)
        except LeaseLostError:  # revoked before the body ran: no __exit__ will follow
            ctx = leave_phase(rt)
            if ctx is None:
                raise
            exit_phase(rt, ctx)
        return self._ctx

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._ctx is not None and _runtime is not None:
            self._ctx = None
            ctx = leave_phase(_runtime)
            if ctx is not None:
                exit_phase(_runtime, ctx)


def phase(name: str, *, iteration: int | None = None) -> _Phase:
    """Gate a phase on the job's permit: ``@rollmux.phase("train")`` or ``with rollmux.phase("train"):``.

    Args:
        name: "rollout", "train" or "sync".
        iteration: the job iteration this phase belongs to; None counts this process's calls of
            `name` (0, 1, 2, ...), which fits loops that run every phase once per iteration.

    Raises (opted in only):
        PermitWaitTimeoutError, JobAbortedError, RankLeaseError, SidecarUnreachableError.
    """
    if _runtime is None and _resolved and name in PHASE_ORDER:
        return _NOOP_PHASES[name]  # not opted in: a shared, stateless no-op
    return _Phase(name, iteration)


class _NoopPhase(_Phase):
    """What ``phase()`` returns once the shim knows it is off: enter/exit do nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None


_NOOP_PHASES = {p.value: _NoopPhase(p.value, None) for p in PHASE_ORDER}


# ------------------------------------------------------------------------------- progress / state


def runtime_hook(finished: int, total: int) -> Migration | None:
    """Report rollout progress (``finished`` of ``total`` responses) during a rollout phase.

    Returns:
        The coordinator's long-tail migration directive once the rollout is tail-bound (stop using
        ``release_nodes``, finish on ``keep_nodes``), else None. Always None when not opted in or
        outside an owned rollout phase.
    """
    rt = _runtime if (_runtime is not None or _resolved) else _active()
    ctx = None if rt is None else rt.current
    if rt is None or ctx is None or ctx.lease is None or ctx.phase != "rollout":
        return None
    if ctx.lost:
        raise lost_error(rt, ctx)
    migrate = call(rt, "Progress", rt.client.progress, rt.rank_id, ctx.lease.epoch, finished, total, timeout_s=30.0)
    if migrate is not None and ctx.migration is None:
        ctx.migration = migrate
    if ctx.migration is None or ctx.migration_taken:
        return None
    ctx.migration_taken = True  # one directive per rollout: follow it once
    return ctx.migration


def register_state(*objects: Any, name: str | None = None) -> None:
    """Register modules, optimizers and loose tensors to be offloaded between phases.

    Outside a phase the registered state lives in host buffers allocated once for the job (here, for
    the state registered so far and the gradients and optimizer state training will add); each phase
    reloads it first and offloads it at the end. No-op when not opted in.

    Args:
        objects: ``torch.nn.Module``, ``torch.optim.Optimizer`` or ``torch.Tensor`` instances.
        name: name prefix in the cache (default: the kind and position).
    """
    rt = _active()
    if rt is None:
        return
    from rollmux.shim.state_cache import StateCache

    if rt.cache is None:
        rt.cache = StateCache(f"{rt.job}/{rt.rank}")
    for i, obj in enumerate(objects):
        label = f"{name or 'state'}{i}"
        if hasattr(obj, "param_groups") and hasattr(obj, "state"):
            rt.cache.register_optimizer(f"{label}.optimizer", obj)
        elif hasattr(obj, "parameters") and hasattr(obj, "buffers"):
            rt.cache.register_module(f"{label}.module", obj)
        else:
            rt.cache.register_tensor(f"{label}.tensor", obj)
    # Pin the host buffers now, at registration: pinning runs at a few GB/s, too slow for a phase boundary.
    rt.cache.reserve(rt.cache.expected_bytes())


def enabled() -> bool:
    """True when this process is opted in and attached to its sidecar."""
    return _active() is not None


def shutdown(*, job_done: bool = False) -> None:
    """Detach from the sidecar (ends this rank's lease cleanly) and drop the state cache. Idempotent.

    Args:
        job_done: the whole job finished: the sidecar deregisters it at the coordinator.
    """
    global _runtime
    rt = _runtime
    if rt is None:
        return
    try:
        detach(rt, job_done=job_done)
    finally:
        if rt.cache is not None:
            rt.cache.reload()  # leave the registered tensors usable after the job
            rt.cache.release()
        _runtime = None


# ----------------------------------------------------------------------------- extra rank handles


class RankHandle:
    """A rank of the job attached to a sidecar other than this process's own (see :func:`attach_rank`).

    An adapter whose trainer loop runs in one process but gates phases on two pools (a disaggregated
    job's rollout permit is held on a rollout node) takes the rollout pool's permit through one.
    """

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    @property
    def pool(self) -> str:
        """The pool of the sidecar's node."""
        return self._rt.pool

    def enter(self, name: str, iteration: int) -> PhaseContext:
        """Block until this rank's permit for `name` of `iteration` is granted (or follow it)."""
        return enter_phase(self._rt, name, iteration)

    def exit(self, ctx: PhaseContext) -> None:
        """End the phase: release the permit with its measured duration."""
        current = leave_phase(self._rt)
        if current is not None:
            exit_phase(self._rt, current)

    def close(self, *, job_done: bool = False) -> None:
        """Detach this rank (ends its lease cleanly). Idempotent."""
        detach(self._rt, job_done=job_done)


def attach_rank(*, socket: str, job: str, job_token: str, rank: int, permit_timeout_s: float | None = None,
                event_log: str | None = None, deployment: str | None = None,
                connect_timeout_s: float = 15.0) -> RankHandle:
    """Attach one more rank of the job, from this process, to the sidecar at `socket` (`deployment`
    as for :func:`init`).

    Raises:
        SidecarUnreachableError: nothing answers on `socket`.
        ShimConfigError: the sidecar refused the job or rank.
    """
    timeout = permit_timeout_s or float(os.environ.get(env.PERMIT_TIMEOUT_S) or DEFAULT_PERMIT_TIMEOUT_S)
    return RankHandle(attach(socket, job, job_token, rank, timeout, event_log, connect_timeout_s,
                             _deployment(deployment, job)))


__all__ = ["PhaseContext", "RankHandle", "Registration", "JobRegistrationError", "attach_rank", "enabled", "init",
           "phase", "register", "register_state", "runtime_hook", "shutdown"]
