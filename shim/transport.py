"""The shim's connection to the node sidecar: attach a rank over the Unix socket, consume its
``Attach`` stream (revocations, migration and relocation directives) in a watcher thread, and make
the unary calls through the wire's typed client (``rollmux.wire.sidecar_client``), saying in each
error what the rank was doing and what to do.

``grpc`` is imported only when a rank attaches: a process that is not opted in never imports it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

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

T = TypeVar("T")
P = ParamSpec("P")


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
    from rollmux.wire.sidecar_client import SidecarClient

    try:
        client = SidecarClient.connect(path, connect_timeout_s)
    except SidecarUnreachableError as exc:
        raise unreachable(path, str(exc)) from None
    try:
        attached, events = client.attach(job, token, rank, os.getpid())
    except SidecarUnreachableError as exc:
        client.close()
        raise unreachable(path, f"the sidecar cannot attach this rank: {exc}") from None
    except SidecarError as exc:
        client.close()
        raise ShimConfigError(f"the sidecar at {path} refused job {job!r} rank {rank}: {exc}") from None
    rt = Runtime(socket=path, job=job, token=token, rank=rank, timeout_s=timeout_s, event_log=event_log,
                 client=client, events=events, rank_id=attached.rank_id, node_id=attached.node_id,
                 pool=attached.pool, deployment=deployment)
    threading.Thread(target=watch, args=(rt,), name="rollmux-lease", daemon=True).start()
    return rt


def watch(rt: Runtime) -> None:
    """Consume the Attach stream: revocations and migration directives; notice a lost sidecar."""
    try:
        for event in rt.events:
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
    except SidecarError as exc:
        if not rt.closing:
            rt.broken = f"the sidecar stream ended: {exc.args[0] if exc.args else ''}"
        return
    if not rt.closing:
        rt.broken = "the sidecar ended this rank's lease"


def call(rt: Runtime, method: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Make the sidecar call `fn(*args, **kwargs)` (a method of the rank's client, named `method` in
    errors), saying in its error whose call it was.

    Raises:
        PermitWaitTimeoutError, JobAbortedError, RankLeaseError: as the wire raised them (the wait
            timed out; the job lost a rank; a refusal: not legal now).
        SidecarUnreachableError: unreachable, or the Attach stream broke before the call.
        SidecarError: any other refusal.
    """
    if rt.broken:
        raise unreachable(rt.socket, rt.broken)
    try:
        return fn(*args, **kwargs)
    except PermitWaitTimeoutError as exc:
        raise PermitWaitTimeoutError(f"job {rt.job!r} rank {rt.rank}: {exc or 'permit wait timed out'}") from None
    except (JobAbortedError, RankLeaseError):
        raise
    except SidecarUnreachableError as exc:
        raise unreachable(rt.socket, f"the sidecar call {method} failed: {exc}") from None
    except SidecarError as exc:
        raise SidecarError(f"sidecar call {method} failed: {exc}") from None


def detach(rt: Runtime, *, job_done: bool) -> None:
    """End the rank's lease cleanly and close its channel; a sidecar already gone ended the lease with it.
    Idempotent."""
    if rt.closing and rt.client is None:
        return
    rt.closing = True
    client, rt.client = rt.client, None
    if client is None:
        return
    try:
        client.detach(rt.rank_id, job_done=job_done, timeout_s=30.0)
    except SidecarError:
        pass  # the sidecar is gone: the lease ended with it
    finally:
        client.close()


__all__ = ["attach", "call", "detach", "unreachable", "watch"]
