"""The sidecar protocol's client: one rank's typed calls to its node's sidecar over the Unix socket.

Besides the converter (:mod:`rollmux.wire.convert`) this is the only code that builds the sidecar's
messages (``rollmux.proto.sidecar_v1_pb2``); callers pass and get domain types. A refused call raises
the sidecar column of the one error table (:func:`rollmux.wire.errors.error_from_rpc`), with the
server's details as its message.

``grpc`` and the stubs are imported when a client is made: the in-trainer shim imports this module
before it is opted in, and a process that is not opted in never imports ``grpc``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rollmux.core.model import JobSpec, Lease, Migration, Phase, Relocation, Revocation
from rollmux.wire.errors import SidecarUnreachableError, error_from_rpc

RankEvent = Lease | Revocation | Migration | Relocation
"""What the Attach stream carries after ``Attached``: a grant, a revocation, or a directive."""


@dataclass(frozen=True, slots=True)
class Attached:
    """The sidecar's answer to an Attach: the rank's lease id and the node it holds it on."""

    rank_id: str  # carried on every later call of the rank
    node_id: str
    pool: str  # "rollout" | "train"


class SidecarClient:
    """A channel to the node sidecar at `path` with one typed method per call of the protocol.

    Raises (every method):
        SidecarError: the sidecar refused or failed the call; the subclass comes from the error's code
            (`PermitWaitTimeoutError`, `JobAbortedError`, `RankLeaseError`, `SidecarUnreachableError`, ...).
    """

    def __init__(self, path: str) -> None:
        import grpc

        from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc

        self.path = path
        self._grpc = grpc
        self.channel = grpc.insecure_channel(f"unix:{path}")
        self._stub = spb_grpc.SidecarStub(self.channel)

    @classmethod
    def connect(cls, path: str, timeout_s: float) -> SidecarClient:
        """A client whose socket accepted a connection within `timeout_s`.

        Raises:
            SidecarUnreachableError: no socket at `path`, or it did not accept in time (its message
                says which).
        """
        if not os.path.exists(path):
            raise SidecarUnreachableError("no sidecar socket exists at that path")
        client = cls(path)
        try:
            client._grpc.channel_ready_future(client.channel).result(timeout=timeout_s)
        except client._grpc.FutureTimeoutError:
            client.close()
            raise SidecarUnreachableError(f"the socket did not accept a connection within {timeout_s:g}s "
                                          "(stale socket file: is the sidecar process running?)") from None
        return client

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout_s)
        except self._grpc.RpcError as exc:
            raise error_from_rpc(exc, sidecar=True) from None

    # ------------------------------------------------------------------------------------- calls

    def attach(self, job: str, token: str, rank: int, pid: int) -> tuple[Attached, Iterator[RankEvent | None]]:
        """Open rank `rank`'s lease: the sidecar's ``Attached`` answer and the stream's later events
        (None for an event this release does not know). The lease lasts while the stream is open;
        iterating it raises the error it ended with."""
        from rollmux.proto import sidecar_v1_pb2 as spb
        from rollmux.wire import convert

        stream = self._stub.Attach(spb.AttachRequest(job=job, job_token=token, rank=rank, pid=pid))
        try:
            first = next(stream)
        except self._grpc.RpcError as exc:
            raise error_from_rpc(exc, sidecar=True) from None
        attached = convert.attached_from_pb(first)

        def events() -> Iterator[RankEvent | None]:
            try:
                for ev in stream:
                    yield convert.rank_event_from_pb(ev)
            except self._grpc.RpcError as exc:
                raise error_from_rpc(exc, sidecar=True) from None

        return attached, events()

    def acquire(self, rank_id: str, phase: Phase, iteration: int, wait_s: float, *, timeout_s: float) -> Lease:
        """Block until the job's permit for `phase` of `iteration` is granted on this node (at most
        `wait_s`; the call's own deadline is `timeout_s`)."""
        from rollmux.proto import sidecar_v1_pb2 as spb
        from rollmux.wire import convert

        req = spb.AcquireRequest(rank_id=rank_id, phase=convert.PHASE_TO_PB[phase], iteration=iteration,
                                 timeout_s=wait_s)
        return convert.lease_from_pb(self._call("Acquire", req, timeout_s).lease)

    def release(self, rank_id: str, epoch: int, duration_s: float, state_host_bytes: int, *,
                timeout_s: float) -> None:
        """Release the permit of `epoch` with the phase's measured duration and the host bytes its
        state cache holds."""
        from rollmux.proto import sidecar_v1_pb2 as spb

        self._call("Release", spb.ReleaseRequest(rank_id=rank_id, epoch=epoch, duration_s=duration_s,
                                                 state_host_bytes=state_host_bytes), timeout_s)

    def progress(self, rank_id: str, epoch: int, finished: int, total: int, *, timeout_s: float) -> Migration | None:
        """Report rollout progress; the coordinator's long-tail migration directive, if it sent one."""
        from rollmux.proto import sidecar_v1_pb2 as spb
        from rollmux.wire import convert

        resp = self._call("Progress", spb.ProgressRequest(rank_id=rank_id, epoch=epoch, finished=finished,
                                                          total=total), timeout_s)
        return convert.migration_from_pb(resp.migrate) if resp.HasField("migrate") else None

    def relocate(self, rank_id: str, epoch: int, *, timeout_s: float) -> Relocation:
        """Acknowledge relocation directive `epoch` at a boundary; the directive as it stands now."""
        from rollmux.proto import sidecar_v1_pb2 as spb
        from rollmux.wire import convert

        resp = self._call("Relocate", spb.RelocateRequest(rank_id=rank_id, epoch=epoch), timeout_s)
        return convert.relocation_from_pb(resp.directive)

    def detach(self, rank_id: str, *, job_done: bool, timeout_s: float) -> None:
        """End the rank's lease cleanly (`job_done`: the sidecar deregisters the finished job)."""
        from rollmux.proto import sidecar_v1_pb2 as spb

        self._call("Detach", spb.DetachRequest(rank_id=rank_id, job_done=job_done), timeout_s)

    def register(self, spec: JobSpec, nonce: str, *, timeout_s: float) -> tuple[str, str, str | None]:
        """Register `spec` with the coordinator through the sidecar (`nonce` makes a retry idempotent).
        Fails at once when nobody listens on the socket (no wait for it to become ready).

        Returns:
            (job, token, deployment): the registered name, the job token and the deployment mode the
            coordinator chose (None: not decided). The shim wraps them in its ``Registration``, the
            one job identity type of the shim and the adapters (above this layer).
        """
        from rollmux.proto import sidecar_v1_pb2 as spb
        from rollmux.wire import convert

        resp = self._call("Register", spb.RegisterRequest(spec=convert.spec_to_pb(spec), nonce=nonce), timeout_s)
        return resp.job, resp.job_token, resp.deployment or None


__all__ = ["Attached", "RankEvent", "SidecarClient"]
