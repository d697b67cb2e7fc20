"""The errors a call on either protocol can end in, and how their codes cross the wire.

Coordinator protocol: every refusal is a `ServiceError` whose `code` (`rollmux.core.errors.ErrorCode`)
names why. Sidecar protocol: every refusal is a `SidecarError`. On both, the server aborts the call
with the code's gRPC status and the code itself in the trailing metadata (`ERROR_CODE_KEY`), and the
client raises the class again from the code. A receiver that finds no code there (a peer from before
codes were sent) falls back to the status alone. A request refused with a `ServiceError` has changed
no state.

``grpc`` is imported only by the functions that need it: the in-trainer shim imports these classes
before it is opted in, and a process that is not opted in never imports ``grpc``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, overload

from rollmux.core.errors import ErrorCode, RollMuxError

if TYPE_CHECKING:
    import grpc

ERROR_CODE_KEY = "x-rollmux-error-code"
"""Trailing gRPC metadata carrying the `ErrorCode` of a refused call (coordinator and sidecar)."""

STATUS_NAME: dict[ErrorCode, str] = {
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.FAILED_PRECONDITION: "FAILED_PRECONDITION",
    ErrorCode.STALE_EPOCH: "FAILED_PRECONDITION",
    ErrorCode.OUT_OF_ORDER: "FAILED_PRECONDITION",
    ErrorCode.PERMISSION_DENIED: "PERMISSION_DENIED",
    ErrorCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    ErrorCode.NOT_READY: "UNAVAILABLE",
    ErrorCode.PERMIT_TIMEOUT: "DEADLINE_EXCEEDED",
    ErrorCode.JOB_REMOVED: "NOT_FOUND",
    ErrorCode.JOB_ABORTED: "ABORTED",
    ErrorCode.SIDECAR_UNREACHABLE: "UNAVAILABLE",
    ErrorCode.RANK_LEASE: "FAILED_PRECONDITION",
    ErrorCode.PLACEMENT_MISMATCH: "FAILED_PRECONDITION",
}
"""The name of the gRPC status each code is sent with (several codes share one status)."""

_CODE_OF_STATUS: dict[str, ErrorCode] = {
    "INVALID_ARGUMENT": ErrorCode.INVALID_ARGUMENT,
    "NOT_FOUND": ErrorCode.NOT_FOUND,
    "ALREADY_EXISTS": ErrorCode.ALREADY_EXISTS,
    "FAILED_PRECONDITION": ErrorCode.FAILED_PRECONDITION,
    "PERMISSION_DENIED": ErrorCode.PERMISSION_DENIED,
    "UNAUTHENTICATED": ErrorCode.UNAUTHENTICATED,
    "UNAVAILABLE": ErrorCode.NOT_READY,
    "DEADLINE_EXCEEDED": ErrorCode.PERMIT_TIMEOUT,
    "ABORTED": ErrorCode.JOB_ABORTED,
}


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status `code` is sent with."""
    import grpc

    return grpc.StatusCode[STATUS_NAME[code]]


class ServiceError(RollMuxError):
    """A request the coordinator refuses; `code` says why, `status` is the gRPC status it travels with."""

    code = ErrorCode.INTERNAL

    @property
    def status(self) -> grpc.StatusCode:
        return grpc_status(self.code)


class InvalidArgumentError(ServiceError, ValueError):
    """A request field is missing, negative, too long or otherwise malformed."""

    code = ErrorCode.INVALID_ARGUMENT


class NotFoundError(ServiceError, KeyError):
    """A job, node or lease id that the coordinator does not know."""

    code = ErrorCode.NOT_FOUND

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AlreadyExistsError(ServiceError):
    """A job or node name that is already registered (with other credentials)."""

    code = ErrorCode.ALREADY_EXISTS


class FailedPreconditionError(ServiceError):
    """The request is well-formed but not legal now (out-of-order phase, stale epoch, ...)."""

    code = ErrorCode.FAILED_PRECONDITION


class StaleEpochError(FailedPreconditionError):
    """A renew, release or progress report carrying an epoch that no longer holds the lease."""

    code = ErrorCode.STALE_EPOCH


class OutOfOrderError(FailedPreconditionError):
    """A permit asked for a phase that is not the job's next one in on-policy order."""

    code = ErrorCode.OUT_OF_ORDER


class PermissionDeniedError(ServiceError):
    """Missing or wrong token, or a job touching another job's permit."""

    code = ErrorCode.PERMISSION_DENIED


class UnauthenticatedError(ServiceError):
    """No credentials at all where some are required."""

    code = ErrorCode.UNAUTHENTICATED


class NotReadyError(ServiceError):
    """The coordinator is recovering (store unreachable, state reloading, not the leader), or unreachable."""

    code = ErrorCode.NOT_READY


class PermitTimeoutError(RollMuxError, TimeoutError):
    """A permit wait reached its deadline; the message says what the permit was waiting for."""

    code = ErrorCode.PERMIT_TIMEOUT


class JobRemovedError(RollMuxError):
    """The job was removed (by an operator) while it waited for a permit."""

    code = ErrorCode.JOB_REMOVED


# ------------------------------------------------------------------ the sidecar protocol's errors


class SidecarError(RollMuxError):
    """Base class of every error the sidecar and the shim raise on purpose."""

    code = ErrorCode.FAILED_PRECONDITION


class ShimConfigError(SidecarError, ValueError):
    """The shim is opted in but its configuration is incomplete (missing job name or token)."""

    code = ErrorCode.INVALID_ARGUMENT


class SidecarUnreachableError(SidecarError, ConnectionError):
    """Opted in, but the node sidecar (or the coordinator behind it) cannot be reached."""

    code = ErrorCode.SIDECAR_UNREACHABLE


class RankLeaseError(SidecarError):
    """A rank call the sidecar refuses: unknown rank id, stale epoch, or a call out of turn."""

    code = ErrorCode.RANK_LEASE


class JobAbortedError(SidecarError):
    """The job lost a rank (or its lease) while this rank waited; stop the job."""

    code = ErrorCode.JOB_ABORTED


class PermitWaitTimeoutError(SidecarError, TimeoutError):
    """A permit was not granted within the wait limit; the message names what it waited for."""

    code = ErrorCode.PERMIT_TIMEOUT


class LeaseLostError(SidecarError):
    """The permit of the running phase was revoked (expired, job removed): the shim stopped the phase.

    Its results are fenced (the coordinator refuses the stale epoch): do not commit them; ask for
    the phase again, or end the job.
    """

    code = ErrorCode.STALE_EPOCH

    def __init__(self, message: str = "the permit of this phase was revoked; the phase was stopped: do not "
                                      "commit its results, acquire the phase again") -> None:
        super().__init__(message)


class PlacementMismatchError(FailedPreconditionError, RankLeaseError):
    """A job's rank attaches on a node outside its placement (I4); the message names both node sets.

    The coordinator refuses with it and the sidecar passes the same error on to the rank."""

    code = ErrorCode.PLACEMENT_MISMATCH


ERROR_CLASSES: dict[ErrorCode, tuple[type[ServiceError], type[SidecarError]]] = {
    # code: (what a coordinator call raises, what a sidecar call raises)
    ErrorCode.INTERNAL: (ServiceError, SidecarError),
    ErrorCode.INVALID_ARGUMENT: (InvalidArgumentError, SidecarError),
    ErrorCode.NOT_FOUND: (NotFoundError, SidecarError),
    ErrorCode.ALREADY_EXISTS: (AlreadyExistsError, SidecarError),
    ErrorCode.FAILED_PRECONDITION: (FailedPreconditionError, RankLeaseError),
    ErrorCode.STALE_EPOCH: (StaleEpochError, RankLeaseError),
    ErrorCode.OUT_OF_ORDER: (OutOfOrderError, RankLeaseError),
    ErrorCode.PERMISSION_DENIED: (PermissionDeniedError, SidecarError),
    ErrorCode.UNAUTHENTICATED: (UnauthenticatedError, SidecarError),
    ErrorCode.NOT_READY: (NotReadyError, SidecarUnreachableError),
    ErrorCode.PERMIT_TIMEOUT: (ServiceError, PermitWaitTimeoutError),
    ErrorCode.JOB_REMOVED: (ServiceError, SidecarError),
    ErrorCode.JOB_ABORTED: (ServiceError, JobAbortedError),
    ErrorCode.SIDECAR_UNREACHABLE: (ServiceError, SidecarUnreachableError),
    ErrorCode.RANK_LEASE: (ServiceError, RankLeaseError),
    ErrorCode.PLACEMENT_MISMATCH: (PlacementMismatchError, PlacementMismatchError),
}
"""The one table of both protocols: the class a refused call raises again from its code, per protocol."""


def code_of(status: grpc.StatusCode, metadata: Iterable[tuple[str, str | bytes]] | None) -> ErrorCode:
    """The `ErrorCode` a refused call carried; from `status` alone when its trailing metadata has none
    (or one this release does not know)."""
    for key, value in metadata or ():
        if key == ERROR_CODE_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            try:
                return ErrorCode(text)
            except ValueError:
                break
    return _CODE_OF_STATUS.get(status.name, ErrorCode.INTERNAL)


def trailing_metadata(code: ErrorCode) -> tuple[tuple[str, str], ...]:
    """What a server sends with a refusal so that the client can raise the same error."""
    return ((ERROR_CODE_KEY, code.value),)


@overload
def error_from_rpc(exc: grpc.RpcError, *, sidecar: Literal[False] = False) -> ServiceError: ...
@overload
def error_from_rpc(exc: grpc.RpcError, *, sidecar: Literal[True]) -> SidecarError: ...


def error_from_rpc(exc: grpc.RpcError, *, sidecar: bool = False) -> ServiceError | SidecarError:
    """The error a failed call stands for, from `ERROR_CLASSES`: a coordinator call's `ServiceError`
    (its message keeps the status name), or with `sidecar` a sidecar call's `SidecarError` (its message
    is the server's details; the status name leads only where the code has no class of its own)."""
    status = exc.code()  # type: ignore[attr-defined]
    code = code_of(status, exc.trailing_metadata())  # type: ignore[attr-defined]
    details = exc.details() or ""  # type: ignore[attr-defined]
    coordinator_cls, sidecar_cls = ERROR_CLASSES.get(code, (ServiceError, SidecarError))
    if not sidecar:
        return coordinator_cls(f"{status.name}: {details}")
    return sidecar_cls(f"{status.name} {details}" if sidecar_cls is SidecarError else details)


__all__ = ["ERROR_CLASSES", "ERROR_CODE_KEY", "STATUS_NAME", "AlreadyExistsError", "FailedPreconditionError",
           "InvalidArgumentError", "JobAbortedError", "JobRemovedError", "LeaseLostError", "NotFoundError",
           "NotReadyError", "OutOfOrderError", "PermissionDeniedError", "PermitTimeoutError",
           "PermitWaitTimeoutError", "PlacementMismatchError", "RankLeaseError", "ServiceError",
           "ShimConfigError", "SidecarError", "SidecarUnreachableError", "StaleEpochError",
           "UnauthenticatedError", "code_of", "error_from_rpc", "grpc_status", "trailing_metadata"]
