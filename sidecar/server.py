"""The sidecar's gRPC service (``rollmux.sidecar.v1.Sidecar``) on a Unix-domain socket.

Each handler converts the request, calls one :class:`~rollmux.sidecar.agent.NodeAgent` method and
maps our errors to gRPC statuses whose details say what to do. ``Attach`` is a server stream that
stays open for the rank's life; its termination callback is how the sidecar learns a rank died.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from concurrent import futures
from typing import Any

import grpc

from rollmux.coordinator.service.api import ServiceError
from rollmux.model import Lease
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc
from rollmux.sidecar.agent import NodeAgent
from rollmux.sidecar.api import (
    PHASES,
    IllegalTransitionError,
    JobAbortedError,
    PermitWaitTimeoutError,
    RankLeaseError,
    SidecarError,
    SidecarUnreachableError,
)

log = logging.getLogger("rollmux.sidecar")

_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (PermitWaitTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (JobAbortedError, grpc.StatusCode.ABORTED),
    (SidecarUnreachableError, grpc.StatusCode.UNAVAILABLE),
    (RankLeaseError, grpc.StatusCode.FAILED_PRECONDITION),
    (IllegalTransitionError, grpc.StatusCode.FAILED_PRECONDITION),
    (SidecarError, grpc.StatusCode.INTERNAL),
    (ServiceError, grpc.StatusCode.UNAVAILABLE),
]


def _abort(context: grpc.ServicerContext, exc: Exception) -> None:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            context.abort(code, f"{type(exc).__name__}: {exc}")
    raise exc


def lease_to_pb(lease: Lease) -> spb.SidecarLease:
    return spb.SidecarLease(job=lease.job, phase=lease.phase.value, iteration=lease.iteration, epoch=lease.epoch,
                            nodes=list(lease.nodes), ttl_s=lease.ttl_s)


class SidecarServicer(spb_grpc.SidecarServicer):
    """Args:
        agent: the node agent every call goes to.
    """

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def Attach(self, request: spb.AttachRequest, context: grpc.ServicerContext) -> Any:
        if not request.job or not request.job_token:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job and job_token are required: set ROLLMUX_JOB and "
                                                            "ROLLMUX_JOB_TOKEN (or pass them to rollmux.init)")
        try:
            lease, inbox = self.agent.attach(request.job, request.job_token, request.rank, request.pid)
        except (SidecarError, ServiceError) as exc:
            _abort(context, exc)
            return
        def on_done() -> None:  # the stream ended: a clean Detach happened first, or the rank died
            self.agent.rank_gone(lease.rank_id, clean=False)

        context.add_callback(on_done)
        yield spb.RankEvent(attached=spb.Attached(rank_id=lease.rank_id, node_id=self.agent.config.node_id,
                                                  pool=self.agent.config.pool.value))
        while context.is_active():
            try:
                kind, payload = inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "detached":
                return
            if kind == "granted":
                yield spb.RankEvent(granted=spb.Granted(lease=spb.SidecarLease(
                    job=payload.job, phase=_phase_name(payload.phase), iteration=payload.iteration,
                    epoch=payload.epoch, nodes=list(payload.nodes), ttl_s=payload.ttl_s)))
            elif kind == "revoked":
                yield spb.RankEvent(revoked=spb.Revoked(job=payload.job, epoch=payload.epoch, reason=payload.reason))
            elif kind == "migrate":
                yield spb.RankEvent(migrate=spb.Migrate(job=payload.job, epoch=payload.epoch,
                                                        keep_nodes=list(payload.keep_nodes),
                                                        release_nodes=list(payload.release_nodes)))

    def Acquire(self, request: spb.AcquireRequest, context: grpc.ServicerContext) -> Any:
        if request.phase not in PHASES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"phase={request.phase!r} is invalid: expected one of {', '.join(PHASES)}")
        if request.iteration < 0 or request.timeout_s <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"iteration={request.iteration} / timeout_s={request.timeout_s}: expected >= 0 / > 0")
        start = time.monotonic()
        try:
            lease = self.agent.acquire(request.rank_id, request.phase, request.iteration, request.timeout_s)
        except (SidecarError, ServiceError, IllegalTransitionError) as exc:
            _abort(context, exc)
            return None
        return spb.AcquireResponse(lease=lease_to_pb(lease), waited_s=time.monotonic() - start)

    def Release(self, request: spb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        try:
            released, phase, it = self.agent.release(request.rank_id, request.epoch, request.duration_s,
                                                     request.state_host_bytes)
        except (SidecarError, ServiceError, IllegalTransitionError) as exc:
            _abort(context, exc)
            return None
        return spb.ReleaseResponse(node_released=released, next_phase=phase, next_iteration=it)

    def Progress(self, request: spb.ProgressRequest, context: grpc.ServicerContext) -> Any:
        try:
            m = self.agent.progress(request.rank_id, request.epoch, request.finished, request.total)
        except (SidecarError, ServiceError) as exc:
            _abort(context, exc)
            return None
        resp = spb.ProgressResponse()
        if m is not None:
            resp.migrate.CopyFrom(spb.Migrate(job=m.job, epoch=m.epoch, keep_nodes=list(m.keep_nodes),
                                              release_nodes=list(m.release_nodes)))
        return resp

    def Detach(self, request: spb.DetachRequest, context: grpc.ServicerContext) -> Any:
        self.agent.rank_gone(request.rank_id, clean=True, job_done=request.job_done)
        return spb.DetachResponse()

    def NodeStatus(self, request: spb.NodeStatusRequest, context: grpc.ServicerContext) -> Any:
        s = self.agent.status()
        return spb.NodeStatusResponse(node_id=s["node_id"], pool=s["pool"], connection=s["connection"],
                                      ranks=s["ranks"], cached_state_host_bytes=s["cached_state_host_bytes"],
                                      events=s["events"])


def _phase_name(value: int) -> str:
    from rollmux.proto import convert

    return convert.phase_from_pb(value).value


def serve(agent: NodeAgent, socket_path: str, *, max_workers: int = 64) -> grpc.Server:
    """Start the service on `socket_path` (a stale socket file is replaced); returns the server."""
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rollmux-uds"))
    spb_grpc.add_SidecarServicer_to_server(SidecarServicer(agent), server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    os.chmod(socket_path, 0o660)
    return server
