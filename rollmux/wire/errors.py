"""The errors a coordinator call can end in, and how their codes cross the wire.

Every refusal is a `ServiceError` whose `code` (`rollmux.core.errors.ErrorCode`) names why; the server
aborts the call with the code's gRPC status and the code itself in the trailing metadata
(`ERROR_CODE_KEY`), and the client raises the same class again from the code. A receiver that
finds no code there (a peer from before codes were sent) falls back to the status alone.
A request refused with a `ServiceError` has changed no state.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from rollmux.core.errors import ErrorCode, RollMuxError

ERROR_CODE_KEY = "x-rollmux-error-code"
"""Trailing gRPC metadata carrying the `ErrorCode` of a refused call (coordinator and sidecar)."""

STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.STALE_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.OUT_OF_ORDER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.PERMIT_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.JOB_REMOVED: grpc.StatusCode.NOT_FOUND,
    ErrorCode.JOB_ABORTED: grpc.StatusCode.ABORTED,
    ErrorCode.SIDECAR_UNREACHABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.RANK_LEASE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.PLACEMENT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
}
"""The gRPC status each code is sent with (several codes share one status)."""

_CODE_OF_STATUS: dict[grpc.StatusCode, ErrorCode] = {
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND: ErrorCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: ErrorCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED: ErrorCode.UNAUTHENTICATED,
    grpc.StatusCode.UNAVAILABLE: ErrorCode.NOT_READY,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.PERMIT_TIMEOUT,
    grpc.StatusCode.ABORTED: ErrorCode.JOB_ABORTED,
}


class ServiceError(RollMuxError):
    """A request the coordinator refuses; `code` says why, `status` is the gRPC status it travels with."""

    code = ErrorCode.INTERNAL

    @property
    def status(self) -> grpc.StatusCode:
        return STATUS_OF[self.code]


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


class PlacementMismatchError(FailedPreconditionError):
    """A job's ranks attach on a node outside its placement (I4); the message names both node sets."""

    code = ErrorCode.PLACEMENT_MISMATCH


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


_SERVICE_ERRORS: dict[ErrorCode, type[ServiceError]] = {
    cls.code: cls for cls in (ServiceError, InvalidArgumentError, NotFoundError, AlreadyExistsError,
                              FailedPreconditionError, StaleEpochError, OutOfOrderError, PlacementMismatchError,
                              PermissionDeniedError, UnauthenticatedError, NotReadyError)
}


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
    return _CODE_OF_STATUS.get(status, ErrorCode.INTERNAL)


def trailing_metadata(code: ErrorCode) -> tuple[tuple[str, str], ...]:
    """What a server sends with a refusal so that the client can raise the same error."""
    return ((ERROR_CODE_KEY, code.value),)


def error_from_rpc(exc: grpc.RpcError) -> ServiceError:
    """The `ServiceError` a failed coordinator call stands for (its message keeps the status name)."""
    status = exc.code()  # type: ignore[attr-defined]
    code = code_of(status, exc.trailing_metadata())  # type: ignore[attr-defined]
    cls = _SERVICE_ERRORS.get(code, ServiceError)
    return cls(f"{status.name}: {exc.details() or ''}")  # type: ignore[attr-defined]


__all__ = ["ERROR_CODE_KEY", "STATUS_OF", "AlreadyExistsError", "FailedPreconditionError", "InvalidArgumentError",
           "JobRemovedError", "NotFoundError", "NotReadyError", "OutOfOrderError", "PermissionDeniedError",
           "PermitTimeoutError", "PlacementMismatchError", "ServiceError", "StaleEpochError", "UnauthenticatedError", "code_of",
           "error_from_rpc", "trailing_metadata"]
