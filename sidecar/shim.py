"""The in-process shim: ``rollmux.init``, ``rollmux.phase``, ``rollmux.runtime_hook``,
``rollmux.register_state`` and ``rollmux.shutdown``.

Opt-in: set ``ROLLMUX_SIDECAR_SOCKET`` (see ``rollmux.sidecar.env``) or pass ``socket=`` to
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
:class:`~rollmux.sidecar.api.LeaseLostError` in the thread running it (at its next Python
bytecode: a call blocked in C returns first), offloads its state so the node's next holder finds
the GPU free, and never releases the stale epoch (it is fenced). ``with rollmux.phase(...)`` then
raises ``LeaseLostError``: do not commit that phase's results.

Long-tail migration: a directive for the running rollout (from the Attach stream or a
``runtime_hook`` answer) is kept on the phase's context (``ctx.migration``) and returned by the
next ``runtime_hook`` call.

Relocation (regrouping): a directive from the Attach stream is kept on the runtime and returned by
``rollmux.relocation()``; the job honours it at an iteration boundary with ``rollmux.relocate()``
(``rollmux.sidecar.relocate``).

The shim always talks to the local sidecar socket; there is no direct-to-coordinator mode.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollmux.model import Lease, Migration, Phase, Relocation
from rollmux.sidecar import env, registration
from rollmux.sidecar.api import (
    PHASES,
    JobAbortedError,
    LeaseLostError,
    PermitWaitTimeoutError,
    RankLeaseError,
    ShimConfigError,
    SidecarError,
    SidecarUnreachableError,
    phase_pool,
)
from rollmux.sidecar.registration import Registration, RegistrationError, register

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PERMIT_TIMEOUT_S = 600.0

_runtime: _Runtime | None = None
_resolved = False  # the opt-in was looked at (init ran, explicitly or lazily)
_init_lock = threading.Lock()


# ---------------------------------------------------------------------------------------- records


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
class _Runtime:
    """The opted-in shim's connection and counters (one per process)."""

    socket: str
    job: str
    token: str = field(repr=False)  # the job token (re-attaching after a relocation); never log it
    rank: int
    timeout_s: float
    event_log: str | None
    channel: Any
    stub: Any
    stream: Any
    rank_id: str
    node_id: str
    pool: str
    deployment: str | None = None  # the job's deployment mode: which pool's rank owns each phase (phase_pool)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    current: PhaseContext | None = None
    cache: Any = None  # rollmux.sidecar.state_cache.StateCache, created by register_state
    lost: threading.Event = field(default_factory=threading.Event)  # permit revoked / job aborted
    broken: str | None = None  # why the sidecar stream ended unexpectedly
    closing: bool = False
    migrations: list[Migration] = field(default_factory=list)
    relocation: Relocation | None = None  # the job's latest relocation directive heard (rollmux.relocation)
    relocated: set[int] = field(default_factory=set)  # directive epochs this rank has acted on
    phase_lock: threading.Lock = field(default_factory=threading.Lock)  # guards `current` against the watcher


# ------------------------------------------------------------------------------------------- init


def init(*, socket: str | None = None, job: str | None = None, job_token: str | None = None,
         rank: int | None = None, permit_timeout_s: float | None = None, event_log: str | None = None,
         deployment: str | None = None, connect_timeout_s: float = 15.0) -> bool:
    """Opt this process in (or not), attaching it to the node's sidecar. Idempotent.

    Every argument defaults to its environment variable (``rollmux.sidecar.env``); an explicit
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
        _runtime = _attach(path, job, token, rank, timeout, event_log or os.environ.get(env.EVENT_LOG) or None,
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


def _unreachable(path: str, why: str) -> SidecarUnreachableError:
    return SidecarUnreachableError(
        f"RollMux is opted in ({env.SIDECAR_SOCKET}={path}) but {why}. Start the node sidecar there "
        f"(`rollmux sidecar --coordinator HOST:PORT --pool rollout|train --socket {path}`), or unset "
        f"{env.SIDECAR_SOCKET} to run without RollMux (the job never runs unscheduled on shared GPUs)")


def _attach(path: str, job: str, token: str, rank: int, timeout_s: float, event_log: str | None,
            connect_timeout_s: float, deployment: str | None) -> _Runtime:
    import grpc

    from rollmux.proto import sidecar_v1_pb2 as spb
    from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc

    if not os.path.exists(path):
        raise _unreachable(path, "no sidecar socket exists at that path")
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
    except grpc.FutureTimeoutError:
        channel.close()
        raise _unreachable(path, f"the socket did not accept a connection within {connect_timeout_s:g}s "
                                 "(stale socket file: is the sidecar process running?)") from None
    stub = spb_grpc.SidecarStub(channel)
    stream = stub.Attach(spb.AttachRequest(job=job, job_token=token, rank=rank, pid=os.getpid()))
    try:
        first = next(stream)
    except grpc.RpcError as exc:
        channel.close()
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise _unreachable(path, f"the sidecar cannot attach this rank: {exc.details()}") from None
        raise ShimConfigError(f"the sidecar at {path} refused job {job!r} rank {rank}: {exc.details()}") from None
    rt = _Runtime(socket=path, job=job, token=token, rank=rank, timeout_s=timeout_s, event_log=event_log, channel=channel,
                  stub=stub, stream=stream, rank_id=first.attached.rank_id, node_id=first.attached.node_id,
                  pool=first.attached.pool, deployment=deployment)
    threading.Thread(target=_watch, args=(rt,), name="rollmux-lease", daemon=True).start()
    return rt


def _watch(rt: _Runtime) -> None:
    """Consume the Attach stream: revocations and migration directives; notice a lost sidecar."""
    import grpc

    try:
        for ev in rt.stream:
            kind = ev.WhichOneof("kind")
            if kind == "revoked":
                _lease_lost(rt, ev.revoked.epoch, ev.revoked.reason or "revoked by the coordinator")
            elif kind == "migrate":
                m = ev.migrate
                directive = Migration(job=m.job, epoch=m.epoch, keep_nodes=tuple(m.keep_nodes),
                                      release_nodes=tuple(m.release_nodes))
                rt.migrations.append(directive)
                cur = rt.current
                if cur is not None and cur.lease is not None and cur.lease.epoch == m.epoch and cur.migration is None:
                    cur.migration = directive
            elif kind == "relocate":
                from rollmux.proto.convert import relocation_from_pb

                heard = relocation_from_pb(ev.relocate)
                if rt.relocation is None or heard.epoch >= rt.relocation.epoch:
                    rt.relocation = heard
    except grpc.RpcError as exc:
        if not rt.closing:
            rt.broken = f"the sidecar stream ended: {exc.code().name} {exc.details()}"
        return
    if not rt.closing:
        rt.broken = "the sidecar ended this rank's lease"


def _lease_lost(rt: _Runtime, epoch: int, reason: str) -> None:
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


def _lost_error(rt: _Runtime, ctx: PhaseContext) -> LeaseLostError:
    return LeaseLostError(f"job {rt.job!r} rank {rt.rank}: the permit of {ctx.phase}({ctx.iteration}) epoch "
                          f"{ctx.lease.epoch if ctx.lease else 0} was revoked ({ctx.lost}); the phase was stopped "
                          "and its results are fenced: do not commit them, acquire the phase again")


def _active() -> _Runtime | None:
    if _runtime is not None or _resolved:
        return _runtime
    init()  # lazily, from the environment
    return _runtime


def _rpc(rt: _Runtime, method: str, request: Any, timeout_s: float) -> Any:
    import grpc

    if rt.broken:
        raise _unreachable(rt.socket, rt.broken)
    try:
        return getattr(rt.stub, method)(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise PermitWaitTimeoutError(f"job {rt.job!r} rank {rt.rank}: {details or 'permit wait timed out'}") \
                from None
        if code == grpc.StatusCode.ABORTED:
            raise JobAbortedError(details) from None
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            raise RankLeaseError(details) from None
        if code == grpc.StatusCode.UNAVAILABLE:
            raise _unreachable(rt.socket, f"the sidecar call {method} failed: {details}") from None
        raise SidecarError(f"sidecar call {method} failed: {code.name} {details}") from None


# ----------------------------------------------------------------------------------------- phases


class _Phase:
    """``rollmux.phase(name)``: a context manager, and a decorator that enters it per call."""

    __slots__ = ("name", "iteration", "_ctx")

    def __init__(self, name: str, iteration: int | None) -> None:
        if name not in PHASES:
            raise ValueError(f"rollmux.phase({name!r}): expected one of {', '.join(PHASES)}")
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
            self._ctx = _enter(rt, self.name, self.iteration)
        except LeaseLostError:  # revoked before the body ran: no __exit__ will follow
            ctx = _leave(rt)
            if ctx is None:
                raise
            _exit(rt, ctx)
        return self._ctx

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._ctx is not None and _runtime is not None:
            self._ctx = None
            ctx = _leave(_runtime)
            if ctx is not None:
                _exit(_runtime, ctx)


def phase(name: str, *, iteration: int | None = None) -> _Phase:
    """Gate a phase on the job's permit: ``@rollmux.phase("train")`` or ``with rollmux.phase("train"):``.

    Args:
        name: "rollout", "train" or "sync".
        iteration: the job iteration this phase belongs to; None counts this process's calls of
            `name` (0, 1, 2, ...), which fits loops that run every phase once per iteration.

    Raises (opted in only):
        PermitWaitTimeoutError, JobAbortedError, RankLeaseError, SidecarUnreachableError.
    """
    if _runtime is None and _resolved and name in PHASES:
        return _NOOP_PHASES[name]  # not opted in: a shared, stateless no-op
    return _Phase(name, iteration)


class _NoopPhase(_Phase):
    """What ``phase()`` returns once the shim knows it is off: enter/exit do nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None


_NOOP_PHASES = {p: _NoopPhase(p, None) for p in PHASES}


def _enter(rt: _Runtime, name: str, iteration: int | None) -> PhaseContext:
    from rollmux.proto import sidecar_v1_pb2 as spb

    if rt.current is not None:
        raise RankLeaseError(f"rollmux.phase({name!r}) entered inside phase {rt.current.phase!r}: phases do "
                             "not nest; end the first one before starting the next")
    it = rt.counters[name] if iteration is None else iteration
    owner = phase_pool(name, rt.deployment) == rt.pool
    ctx = PhaseContext(phase=name, iteration=it, owner=owner, lease=None, t_request=time.time())
    if owner:
        resp = _rpc(rt, "Acquire", spb.AcquireRequest(rank_id=rt.rank_id, phase=name, iteration=it,
                                                       timeout_s=rt.timeout_s), rt.timeout_s + 30.0)
        ls = resp.lease
        ctx.lease = Lease(job=ls.job, phase=Phase(ls.phase), iteration=ls.iteration, epoch=ls.epoch, nodes=tuple(ls.nodes),
                          ttl_s=ls.ttl_s)
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


def _leave(rt: _Runtime) -> PhaseContext | None:
    """Take the running phase off the watcher's hands; a stop it already sent lands here, not later."""
    while True:
        try:
            with rt.phase_lock:
                ctx, rt.current = rt.current, None
            return ctx
        except LeaseLostError:
            continue  # the watcher's stop arrived as the phase ended: it is recorded on ctx.lost


def _exit(rt: _Runtime, ctx: PhaseContext) -> None:
    """End the phase: offload its state, release its permit (unless it was revoked: then raise)."""
    from rollmux.proto import sidecar_v1_pb2 as spb

    t_body = time.time()
    cpu_s = time.process_time() - ctx.cpu_start
    host_bytes = 0
    if rt.cache is not None:
        rt.cache.offload()
        host_bytes = int(rt.cache.host_bytes())
    t_end = time.time()
    if ctx.lost:  # fenced: the epoch is stale, nothing to release; the phase did not happen
        _log_phase(rt, ctx, t_body, cpu_s, t_end)
        raise _lost_error(rt, ctx)
    rt.counters[ctx.phase] = ctx.iteration + 1
    if ctx.lease is not None:
        _rpc(rt, "Release", spb.ReleaseRequest(rank_id=rt.rank_id, epoch=ctx.lease.epoch,
                                                duration_s=t_end - ctx.t_start + ctx.reload_s,
                                                state_host_bytes=host_bytes), rt.timeout_s + 30.0)
    _log_phase(rt, ctx, t_body, cpu_s, t_end)


def _log_phase(rt: _Runtime, ctx: PhaseContext, t_body: float, cpu_s: float, t_end: float) -> None:
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
        raise _lost_error(rt, ctx)
    from rollmux.proto import sidecar_v1_pb2 as spb

    resp = _rpc(rt, "Progress", spb.ProgressRequest(rank_id=rt.rank_id, epoch=ctx.lease.epoch,
                                                     finished=finished, total=total), 30.0)
    if resp.HasField("migrate") and ctx.migration is None:
        m = resp.migrate
        ctx.migration = Migration(job=m.job, epoch=m.epoch, keep_nodes=tuple(m.keep_nodes),
                                  release_nodes=tuple(m.release_nodes))
    if ctx.migration is None or ctx.migration_taken:
        return None
    ctx.migration_taken = True  # one directive per rollout: follow it once
    return ctx.migration


def register_state(*objects: Any, name: str | None = None) -> None:
    """Register modules, optimizers and loose tensors to be offloaded between phases.

    Outside a phase the registered state lives in host buffers allocated once for the job; each
    phase reloads it first and offloads it at the end. No-op when not opted in.

    Args:
        objects: ``torch.nn.Module``, ``torch.optim.Optimizer`` or ``torch.Tensor`` instances.
        name: name prefix in the cache (default: the kind and position).
    """
    rt = _active()
    if rt is None:
        return
    from rollmux.sidecar.state_cache import StateCache

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
    from rollmux.proto import sidecar_v1_pb2 as spb

    rt.closing = True
    try:
        _rpc(rt, "Detach", spb.DetachRequest(rank_id=rt.rank_id, job_done=job_done), 30.0)
    except SidecarError:
        pass  # the sidecar is gone: the lease ended with it
    finally:
        if rt.cache is not None:
            rt.cache.reload()  # leave the registered tensors usable after the job
            rt.cache.release()
        rt.channel.close()
        _runtime = None


# ----------------------------------------------------------------------------- extra rank handles


class RankHandle:
    """A rank of the job attached to a sidecar other than this process's own (see :func:`attach_rank`).

    An adapter whose trainer loop runs in one process but gates phases on two pools (a disaggregated
    job's rollout permit is held on a rollout node) takes the rollout pool's permit through one.
    """

    def __init__(self, rt: _Runtime) -> None:
        self._rt = rt

    @property
    def pool(self) -> str:
        """The pool of the sidecar's node."""
        return self._rt.pool

    def enter(self, name: str, iteration: int) -> PhaseContext:
        """Block until this rank's permit for `name` of `iteration` is granted (or follow it)."""
        return _enter(self._rt, name, iteration)

    def exit(self, ctx: PhaseContext) -> None:
        """End the phase: release the permit with its measured duration."""
        current = _leave(self._rt)
        if current is not None:
            _exit(self._rt, current)

    def close(self, *, job_done: bool = False) -> None:
        """Detach this rank (ends its lease cleanly). Idempotent."""
        from rollmux.proto import sidecar_v1_pb2 as spb

        rt = self._rt
        if rt.closing:
            return
        rt.closing = True
        try:
            _rpc(rt, "Detach", spb.DetachRequest(rank_id=rt.rank_id, job_done=job_done), 30.0)
        except SidecarError:
            pass  # the sidecar is gone: the lease ended with it
        finally:
            rt.channel.close()


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
    return RankHandle(_attach(socket, job, job_token, rank, timeout, event_log, connect_timeout_s,
                              _deployment(deployment, job)))


__all__ = ["PhaseContext", "RankHandle", "Registration", "RegistrationError", "attach_rank", "enabled", "init",
           "phase", "register", "register_state", "runtime_hook", "shutdown"]
