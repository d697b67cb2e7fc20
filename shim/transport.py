"""The shim's connection to the node sidecar: attach a rank over the Unix socket, consume its
``Attach`` stream (revocations, migration and relocation directives) in a watcher thread, and make
the unary calls, mapping gRPC statuses to our errors.

``grpc`` and the generated stubs are imported inside the functions: a process that is not opted
in never imports them.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from rollmux.core.errors import ErrorCode
from rollmux.core.model import Migration, Relocation, Revocation
from rollmux.shim import env
from rollmux.shim.runtime import Runtime, lease_lost
from rollmux.wire.errors import (
    JobAbortedError,
    PermitWaitTimeoutError,
    RankLeaseError,
    ShimConfigError,
    SidecarError,
    SidecarUnreachableError,
)

_REFUSED = frozenset({ErrorCode.RANK_LEASE, ErrorCode.FAILED_PRECONDITION, ErrorCode.STALE_EPOCH,
                      ErrorCode.OUT_OF_ORDER})
"""Codes of a rank call the sidecar (or the coordinator behind it) refuses as not legal now."""


def unreachable(path: str, why: str) -> SidecarUnreachableError:
    """The error for a sidecar that does not answer at `path`, saying `why` and what to do."""
    return SidecarUnreachableError(
        f"RollMux is opted in ({env.SIDECAR_SOCKET}={path}) but {why}. Start the node sidecar there "
        f"(`rollmux sidecar --coordinator HOST:PORT --pool rollout|train --socket {path}`), or unset "
        f"{env.SIDECAR_SOCKET} to run without RollMux (the job never runs unscheduled on shared GPUs)")


def attach(path: str, job: str, token: str, rank: int, timeout_s: float, event_log: str | None,
           connect_timeout_s: float, deployment: str | None) -> Runtime:
    """Attach rank `rank` of `job` to the sidecar at `path` and start its Attach-stream watcher.

    Raises:
        SidecarUnreachableError: no socket, it does not accept, or the sidecar cannot attach the rank.
        ShimConfigError: the sidecar refused the job or rank.
    """
    import grpc

    from rollmux.proto import sidecar_v1_pb2 as spb
    from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc

    if not os.path.exists(path):
        raise unreachable(path, "no sidecar socket exists at that path")
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
    except grpc.FutureTimeoutError:
        channel.close()
        raise unreachable(path, f"the socket did not accept a connection within {connect_timeout_s:g}s "
                                "(stale socket file: is the sidecar process running?)") from None
    stub = spb_grpc.SidecarStub(channel)
    stream = stub.Attach(spb.AttachRequest(job=job, job_token=token, rank=rank, pid=os.getpid()))
    try:
        first = next(stream)
    except grpc.RpcError as exc:
        channel.close()
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise unreachable(path, f"the sidecar cannot attach this rank: {exc.details()}") from None
        raise ShimConfigError(f"the sidecar at {path} refused job {job!r} rank {rank}: {exc.details()}") from None
    rt = Runtime(socket=path, job=job, token=token, rank=rank, timeout_s=timeout_s, event_log=event_log, channel=channel,
                 stub=stub, stream=stream, rank_id=first.attached.rank_id, node_id=first.attached.node_id,
                 pool=first.attached.pool, deployment=deployment)
    threading.Thread(target=watch, args=(rt,), name="rollmux-lease", daemon=True).start()
    return rt


def watch(rt: Runtime) -> None:
    """Consume the Attach stream: revocations and migration directives; notice a lost sidecar."""
    import grpc

    from rollmux.wire import convert

    try:
        for ev in rt.stream:
            event = convert.rank_event_from_pb(ev)
            if isinstance(event, Revocation):
                lease_lost(rt, event.epoch, event.reason or "revoked by the coordinator")
            elif isinstance(event, Migration):
                rt.migrations.append(event)
                cur = rt.current
                if (cur is not None and cur.lease is not None and cur.lease.epoch == event.epoch
                        and cur.migration is None):
                    cur.migration = event
            elif isinstance(event, Relocation) and (rt.relocation is None or event.epoch >= rt.relocation.epoch):
                rt.relocation = event
    except grpc.RpcError as exc:
        if not rt.closing:
            rt.broken = f"the sidecar stream ended: {exc.code().name} {exc.details()}"
        return
    if not rt.closing:
        rt.broken = "the sidecar ended this rank's lease"


def rpc(rt: Runtime, method: str, request: Any, timeout_s: float) -> Any:
    """Call the sidecar's unary `method`, mapping gRPC statuses to our errors.

    Raises:
        PermitWaitTimeoutError: DEADLINE_EXCEEDED. JobAbortedError: ABORTED.
        RankLeaseError: a refusal (`_REFUSED`). SidecarUnreachableError: unreachable, or the stream broke.
        SidecarError: any other status.
    """
    import grpc

    from rollmux.wire.errors import code_of

    if rt.broken:
        raise unreachable(rt.socket, rt.broken)
    try:
        return getattr(rt.stub, method)(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        status, details = exc.code(), exc.details() or ""
        code = code_of(status, exc.trailing_metadata())
        if code is ErrorCode.PERMIT_TIMEOUT:
            raise PermitWaitTimeoutError(f"job {rt.job!r} rank {rt.rank}: {details or 'permit wait timed out'}") \
                from None
        if code is ErrorCode.JOB_ABORTED:
            raise JobAbortedError(details) from None
        if code in _REFUSED:
            raise RankLeaseError(details) from None
        if code in (ErrorCode.SIDECAR_UNREACHABLE, ErrorCode.NOT_READY):
            raise unreachable(rt.socket, f"the sidecar call {method} failed: {details}") from None
        raise SidecarError(f"sidecar call {method} failed: {status.name} {details}") from None


__all__ = ["attach", "rpc", "unreachable", "watch"]
