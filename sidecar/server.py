"""The sidecar's gRPC service (``rollmux.sidecar.v1.Sidecar``) on a Unix-domain socket.

Each handler finds the connection the call came on (:mod:`rollmux.sidecar.peercred`: the peer
passed the ``SO_PEERCRED`` check), validates the request, calls one
:class:`~rollmux.sidecar.agent.NodeAgent` method and maps our errors to gRPC statuses whose details
say what to do. A rank id is honoured only on the connection that attached it. ``Attach`` is a
server stream that stays open for the rank's life; its termination callback is how the sidecar
learns a rank died. An unexpected exception is logged with a request id and answered INTERNAL.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import queue
import secrets
import shutil
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from rollmux.core.errors import ErrorCode
from rollmux.core.model import Phase
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc
from rollmux.sidecar.agent import NodeAgent
from rollmux.sidecar.peercred import Peer, PeerPolicy, SocketFront, private_socket_dir
from rollmux.wire import convert
from rollmux.wire.errors import (
    InvalidArgumentError,
    NotReadyError,
    RankLeaseError,
    ServiceError,
    SidecarError,
    SidecarUnreachableError,
    grpc_status,
    trailing_metadata,
)
from rollmux.wire.names import MAX_NAME_LEN, check_name
from rollmux.wire.sidecar_client import Attached

log = logging.getLogger("rollmux.sidecar")

MAX_TIMEOUT_S = 86_400.0
"""Longest permit wait one Acquire may ask for; the call's own deadline bounds it further."""
MAX_DURATION_S = 86_400.0
"""Longest phase duration a rank may report (a day)."""
MAX_HOST_BYTES = 1 << 50
"""Most host DRAM a rank may report its state cache holds (1 PiB)."""
MAX_NONCE_LEN = 256

def _code(exc: Exception) -> ErrorCode | None:
    """The code the rank gets for `exc` (None: not ours, a bug)."""
    if isinstance(exc, ServiceError):  # the coordinator's answer, passed on
        # the coordinator failed the call: to the rank, the sidecar could not get an answer
        return ErrorCode.SIDECAR_UNREACHABLE if exc.code is ErrorCode.INTERNAL else exc.code
    if isinstance(exc, SidecarError):
        return exc.code
    return None


def _abort(context: grpc.ServicerContext, code: ErrorCode, message: str) -> None:
    """End the call with `code`'s status and the code itself in the trailing metadata."""
    context.set_trailing_metadata(trailing_metadata(code))
    context.abort(grpc_status(code), message)


def _aborted(context: grpc.ServicerContext) -> bool:
    """True once a handler called ``context.abort`` (grpc raises a bare Exception from it)."""
    return context.code() is not None  # type: ignore[attr-defined]


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map our errors to their status; log anything else with a request id and answer INTERNAL."""

    @functools.wraps(fn)
    def wrapper(self: SidecarServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the RPC edge: nothing unexpected may reach the client raw
            code = _code(exc)
            if code is None:
                if _aborted(context):
                    raise  # context.abort() already set the status
                rid = secrets.token_hex(6)
                log.exception("sidecar %s failed (request id %s)", fn.__name__, rid)
                _abort(context, ErrorCode.INTERNAL, f"internal sidecar error (request id {rid}); the sidecar "
                                                    "log has the details")
            _abort(context, code, f"{type(exc).__name__}: {exc}")

    return wrapper


def _stream_guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`_guarded` for a server-streaming handler (a generator)."""

    @functools.wraps(fn)
    def wrapper(self: SidecarServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            yield from fn(self, request, context)
        except Exception as exc:  # noqa: BLE001
            code = _code(exc)
            if code is None:
                if _aborted(context):
                    raise
                rid = secrets.token_hex(6)
                log.exception("sidecar %s failed (request id %s)", fn.__name__, rid)
                _abort(context, ErrorCode.INTERNAL, f"internal sidecar error (request id {rid})")
            _abort(context, code, f"{type(exc).__name__}: {exc}")

    return wrapper


def _name(value: str, field: str) -> str:
    return check_name(value, field, MAX_NAME_LEN)


def _number(value: float, field: str, high: float, *, low: float = 0.0, low_open: bool = False) -> float:
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise InvalidArgumentError(f"{field}={value!r} is invalid: expected a finite number {bound} and <= {high:g}")
    return value


def _rank_id(value: str) -> str:
    if not value or len(value) > 2 * MAX_NAME_LEN:
        raise RankLeaseError("rank_id is missing or malformed: attach first (rollmux.init) and pass the id "
                             "Attach returned")
    return value


class SidecarServicer(spb_grpc.SidecarServicer):
    """Args:
        agent: the node agent every call goes to.
        peer_of: the connection a call came on (None: it did not come through the socket front).
    """

    def __init__(self, agent: NodeAgent, peer_of: Callable[[str], Peer | None]) -> None:
        self.agent = agent
        self._peer_of = peer_of

    def _peer(self, context: grpc.ServicerContext) -> Peer:
        peer = self._peer_of(context.peer())
        if peer is None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "this call did not come through the sidecar's socket: "
                                                             "connect to the socket the sidecar serves")
        assert peer is not None
        return peer

    @_stream_guarded
    def Attach(self, request: spb.AttachRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        _name(request.job, "job")
        if not request.job_token:
            raise InvalidArgumentError("job_token is missing: register the job (rollmux.register, or RegisterJob) and pass "
                           "its token (rollmux.init(job_token=...) or ROLLMUX_JOB_TOKEN)")
        if len(request.job_token) > MAX_NAME_LEN:
            raise RankLeaseError(f"coordinator refused job {request.job!r}: the token is not a RollMux job token")
        pid = peer.pid if peer.pid > 0 else request.pid  # the kernel's word wins where it is visible
        lease, inbox = self.agent.attach(request.job, request.job_token, request.rank, pid, conn=peer.conn)

        def on_done() -> None:  # the stream ended: a clean Detach happened first, or the rank died
            self.agent.rank_gone(lease.rank_id, clean=False, conn=peer.conn)

        context.add_callback(on_done)
        yield convert.attached_to_pb(Attached(rank_id=lease.rank_id, node_id=self.agent.config.node_id,
                                              pool=self.agent.config.pool.value))
        while context.is_active():
            try:
                event = inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if event is None:  # the lease ended (Detach, or the rank died)
                return
            yield convert.rank_event_to_pb(event)

    @_guarded
    def Acquire(self, request: spb.AcquireRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        rank_id = _rank_id(request.rank_id)
        phase = convert.phase_from_pb(request.phase)
        if request.iteration < 0:
            raise InvalidArgumentError(f"iteration={request.iteration} is invalid: expected >= 0")
        timeout = _number(request.timeout_s, "timeout_s", MAX_TIMEOUT_S, low_open=True)
        remaining = context.time_remaining()
        if remaining is not None:  # never wait past the caller's own deadline
            timeout = max(0.001, min(timeout, remaining - 0.05))
        start = time.monotonic()
        lease = self.agent.acquire(rank_id, phase.value, request.iteration, timeout, conn=peer.conn)
        return convert.acquire_response_to_pb(lease, time.monotonic() - start)

    @_guarded
    def Release(self, request: spb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        rank_id = _rank_id(request.rank_id)
        if request.epoch < 0:
            raise InvalidArgumentError(f"epoch={request.epoch} is invalid: expected the epoch of the lease Acquire returned")
        duration = _number(request.duration_s, "duration_s", MAX_DURATION_S)
        host = int(_number(float(request.state_host_bytes), "state_host_bytes", float(MAX_HOST_BYTES)))
        released, phase, it = self.agent.release(rank_id, request.epoch, duration, host, conn=peer.conn)
        return convert.release_response_to_pb(released, Phase(phase) if phase else None, it)

    @_guarded
    def Progress(self, request: spb.ProgressRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        rank_id = _rank_id(request.rank_id)
        if request.total <= 0 or request.finished < 0 or request.finished > request.total:
            raise InvalidArgumentError(f"progress finished={request.finished} total={request.total} is invalid: expected "
                           "0 <= finished <= total and total > 0")
        m = self.agent.progress(rank_id, request.epoch, request.finished, request.total, conn=peer.conn)
        return convert.progress_response_to_pb(m)

    @_guarded
    def Relocate(self, request: spb.RelocateRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        rank_id = _rank_id(request.rank_id)
        if request.epoch <= 0:
            raise InvalidArgumentError(f"epoch={request.epoch} is invalid: expected the epoch of the relocation directive")
        rec, note = self.agent.relocate(rank_id, request.epoch, conn=peer.conn)
        return convert.relocate_response_to_pb(rec, note)

    @_guarded
    def Detach(self, request: spb.DetachRequest, context: grpc.ServicerContext) -> Any:
        peer = self._peer(context)
        self.agent.rank_gone(_rank_id(request.rank_id), clean=True, job_done=request.job_done, conn=peer.conn)
        return convert.detach_response_to_pb()

    @_guarded
    def NodeStatus(self, request: spb.NodeStatusRequest, context: grpc.ServicerContext) -> Any:
        self._peer(context)
        return convert.node_status_to_pb(self.agent.status())

    @_guarded
    def Register(self, request: spb.RegisterRequest, context: grpc.ServicerContext) -> Any:
        self._peer(context)
        if not request.HasField("spec"):
            raise InvalidArgumentError("spec is missing: expected the JobSpec to register")
        _name(request.spec.name, "spec.name")
        if len(request.nonce) > MAX_NONCE_LEN:
            raise InvalidArgumentError(f"nonce is longer than {MAX_NONCE_LEN} characters")
        try:
            job = self.agent.register_job(convert.spec_from_pb(request.spec), request.nonce or None)
        except NotReadyError as exc:
            raise SidecarUnreachableError(f"sidecar of node {self.agent.config.node_id} could not relay the "
                                          f"registration: {exc}") from None
        info = job.registration
        return convert.register_response_to_pb(job.name, job.token, job.deployment, info.state if info else "")


class SidecarServer:
    """The running service: the socket front on the public path, gRPC on a private socket behind it."""

    def __init__(self, grpc_server: grpc.Server, front: SocketFront, private_dir: str) -> None:
        self.grpc_server, self.front, self._dir = grpc_server, front, private_dir

    def stop(self, grace: float | None = None) -> None:
        self.front.stop()
        self.grpc_server.stop(grace).wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def serve(agent: NodeAgent, socket_path: str, *, policy: PeerPolicy | None = None,
          max_workers: int = 64) -> SidecarServer:
    """Start the service on `socket_path` (a stale socket file is replaced); returns the server.

    Args:
        policy: which local peers may connect (default: the sidecar's own uid only).
    """
    policy = policy or PeerPolicy()
    private = private_socket_dir()
    upstream = os.path.join(private, "grpc.sock")
    front = SocketFront(socket_path, upstream, policy,
                        on_refused=lambda pid, uid, gid: agent.note("peer_refused", pid=pid, uid=uid, gid=gid))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rollmux-uds"))
    spb_grpc.add_SidecarServicer_to_server(SidecarServicer(agent, front.peer), server)
    server.add_insecure_port(f"unix:{upstream}")
    server.start()
    front.start(mode=0o666 if (policy.uids or policy.gids) else 0o660)
    return SidecarServer(server, front, private)


__all__ = ["SidecarServer", "SidecarServicer", "serve"]
