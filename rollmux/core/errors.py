"""The root of RollMux's exception hierarchy and the stable error codes that cross the wire.

Each subsystem declares its own errors in its ``api.py`` and roots them here, so a caller can
catch ``RollMuxError`` at a process or RPC boundary and let everything else (bugs) propagate.
Every error a remote caller can see carries an :class:`ErrorCode`; the code travels with the gRPC
status on both protocols (coordinator and sidecar, ``rollmux.wire.errors``), so callers branch on
codes, never on message text.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class ErrorCode(str, Enum):
    """Why a call was refused, stable across releases (values are what travels on the wire).

    A new code may be added; an existing value never changes meaning. A receiver that meets a value
    it does not know treats it as the gRPC status says (``rollmux.wire.errors.error_from_status``).
    """

    INTERNAL = "internal"  # a bug or broken infrastructure; the server log has the details
    INVALID_ARGUMENT = "invalid-argument"  # a request field is missing or malformed
    NOT_FOUND = "not-found"  # a job, node or lease id the coordinator does not know
    ALREADY_EXISTS = "already-exists"  # a name already registered with other credentials
    FAILED_PRECONDITION = "failed-precondition"  # well-formed but not legal now
    STALE_EPOCH = "stale-epoch"  # the epoch no longer holds the lease: stop the phase
    OUT_OF_ORDER = "out-of-order"  # a phase asked for out of on-policy order
    PERMISSION_DENIED = "permission-denied"  # wrong token, or a job touching another job
    UNAUTHENTICATED = "unauthenticated"  # no credentials where some are required
    NOT_READY = "not-ready"  # the coordinator is recovering, or unreachable
    PERMIT_TIMEOUT = "permit-timeout"  # a permit was not granted within the wait
    JOB_REMOVED = "job-removed"  # the job was removed while it waited
    JOB_ABORTED = "job-aborted"  # the job lost a rank on a node: stop it
    SIDECAR_UNREACHABLE = "sidecar-unreachable"  # the node's sidecar (or the coordinator behind it) is gone
    RANK_LEASE = "rank-lease"  # a rank call the sidecar refuses (unknown rank, epoch not held, out of turn)
    PLACEMENT_MISMATCH = "placement-mismatch"  # a job's rank attached on a node outside its placement (I4)


class RollMuxError(Exception):
    """Base class of every error RollMux raises on purpose."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    """What a remote caller sees (a subclass that crosses the wire sets its own)."""


class SpecError(RollMuxError, ValueError):
    """A user-supplied specification (job, node, catalog, trace row) is invalid.

    The message names the field, the offending value and the allowed range.
    """

    code = ErrorCode.INVALID_ARGUMENT
