"""Execution-plane contracts: errors, the two sidecar state machines, and the records they guard.

Two lifecycles, each a str enum with one transition table (every edge commented with its event)
and one ``transition()`` that refuses illegal edges and records (from, to, time, reason):

* :class:`ConnectionState`, the sidecar's one stream to the coordinator;
* :class:`RankState`, one trainer rank's lease on the node (its open ``Attach`` stream).

Torch is never imported here: the sidecar daemon must not create a CUDA context.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollmux.core import lifecycle
from rollmux.core.errors import ErrorCode, RollMuxError
from rollmux.core.model import PHASE_ORDER

S = TypeVar("S", bound=enum.Enum)
HISTORY_LIMIT = 16
"""Transitions kept per record (oldest dropped)."""

# ------------------------------------------------------------------------------------------ errors


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


class PlacementMismatchError(RankLeaseError):
    """The job's rank attaches on a node outside the job's placement (I4); names both node sets."""

    code = ErrorCode.PLACEMENT_MISMATCH


class SidecarTransitionError(SidecarError, lifecycle.IllegalTransitionError):
    """A state change the lifecycle's transition table does not allow."""

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


def _transition(record: Any, table: dict[S, frozenset[S]], new: S, *, now: float, reason: str) -> None:
    """Move ``record.state`` to `new` through `table` (see `rollmux.core.lifecycle.transition`).

    Raises:
        SidecarTransitionError: the edge is not in the table; the record is unchanged.
    """
    lifecycle.transition(record, table, new, now=now, reason=reason, error=SidecarTransitionError,
                         history_limit=HISTORY_LIMIT)


# ------------------------------------------------------------------------------------------ phases

COLOCATED_POOL = {"colocated-train": "train", "colocated-rollout": "rollout"}
"""The one pool every phase of a co-located job runs on (``rollmux.core.model.Deployment`` values)."""


def phase_pool(phase: str, deployment: str | None = None) -> str:
    """The pool whose node a phase's permit holds. Disaggregated (the default): rollout runs on the
    rollout pool, train and sync on the training pool (sync is part of T_train in the policy). A
    co-located job runs every phase on one pool: "colocated-train" on training nodes,
    "colocated-rollout" on rollout nodes (``rollmux.core.model.Deployment``)."""
    if phase not in PHASE_ORDER:
        raise ValueError(f"phase={phase!r} is not a RollMux phase: expected one of {', '.join(PHASE_ORDER)}")
    if deployment in (None, "", "disaggregated"):
        return "rollout" if phase == "rollout" else "train"
    if deployment in COLOCATED_POOL:
        return COLOCATED_POOL[deployment]
    raise ValueError(f"deployment={deployment!r} is not a RollMux deployment mode: expected disaggregated, "
                     f"{' or '.join(COLOCATED_POOL)}")


# ------------------------------------------------------------------------------ connection states


class ConnectionState(str, enum.Enum):
    """The sidecar's stream to the coordinator.

    CONNECTING (registering the node and opening the stream) -> CONNECTED (first snapshot received)
    -> RECONNECTING (stream lost: coordinator restart or network; backoff, re-register, resync)
    -> CONNECTED ... ; CLOSED (sidecar shutting down) is terminal.
    """

    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


CONNECTION_TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    ConnectionState.CONNECTING: frozenset({
        ConnectionState.CONNECTED,  # first NodeDown snapshot arrived
        ConnectionState.CLOSED,  # shut down before the coordinator answered
    }),
    ConnectionState.CONNECTED: frozenset({
        ConnectionState.RECONNECTING,  # the stream ended (coordinator restart, network)
        ConnectionState.CLOSED,  # shutdown
    }),
    ConnectionState.RECONNECTING: frozenset({
        ConnectionState.CONNECTED,  # re-registered; snapshot resynced the node
        ConnectionState.CLOSED,  # shutdown while retrying
    }),
    ConnectionState.CLOSED: frozenset(),
}

# ------------------------------------------------------------------------------------ rank states


class RankState(str, enum.Enum):
    """One rank's lease on its node; the lease is the rank's open ``Attach`` stream.

    IDLE (attached, between phases) -> WAITING (blocked in Acquire) -> RUNNING (holds the job's
    permit) -> RELEASING (released; waits for the job's other local ranks and the GPU memory check)
    -> IDLE. From any live state: DETACHED (clean ``Detach``) or DEAD (the stream dropped without
    one: the process died). DETACHED and DEAD are terminal.
    """

    IDLE = "idle"
    WAITING = "waiting"
    RUNNING = "running"
    RELEASING = "releasing"
    DETACHED = "detached"
    DEAD = "dead"


RANK_TERMINAL = frozenset({RankState.DETACHED, RankState.DEAD})
"""States a rank lease never leaves."""

_LIVE_EXITS = frozenset({RankState.DETACHED, RankState.DEAD})

RANK_TRANSITIONS: dict[RankState, frozenset[RankState]] = {
    RankState.IDLE: frozenset({
        RankState.WAITING,  # Acquire called
        RankState.RUNNING,  # Acquire found the job's permit already granted here (fan-out)
        *_LIVE_EXITS,  # Detach / stream dropped
    }),
    RankState.WAITING: frozenset({
        RankState.RUNNING,  # the job's permit was granted on this node
        RankState.IDLE,  # the wait failed (timeout, job aborted)
        *_LIVE_EXITS,
    }),
    RankState.RUNNING: frozenset({
        RankState.RELEASING,  # Release called
        RankState.IDLE,  # the lease was revoked or the job aborted
        *_LIVE_EXITS,
    }),
    RankState.RELEASING: frozenset({
        RankState.IDLE,  # every local rank released and the node went back to the coordinator
        *_LIVE_EXITS,
    }),
    RankState.DETACHED: frozenset(),
    RankState.DEAD: frozenset(),
}


@dataclass(slots=True, kw_only=True)
class RankLease:
    """A live rank attached to this node (mutable runtime record, changed only through :meth:`move`)."""

    rank_id: str  # sidecar-assigned id, "<job>/<rank>#<n>.<random>" (unguessable)
    job: str  # the job's name
    rank: int  # the rank's number inside its job
    pid: int  # host process id (NVML per-process memory; the kernel's SO_PEERCRED pid where visible)
    conn: str = ""  # the socket connection that attached it: calls naming this rank must come on it
    state: RankState = RankState.IDLE
    history: list[tuple[str, str, float, str]] = field(default_factory=list)  # (from, to, wall s, event)
    host_bytes: int = 0  # host DRAM its state cache holds, as last reported

    def describe(self) -> str:
        return f"rank lease {self.rank_id}"

    def move(self, new: RankState, reason: str) -> None:
        """Transition through :data:`RANK_TRANSITIONS` (raises ``SidecarTransitionError``)."""
        _transition(self, RANK_TRANSITIONS, new, now=time.time(), reason=reason)

    @property
    def live(self) -> bool:
        return self.state not in RANK_TERMINAL


@dataclass(slots=True, kw_only=True)
class Connection:
    """The sidecar's coordinator connection (changed only through :meth:`move`)."""

    node_id: str
    state: ConnectionState = ConnectionState.CONNECTING
    history: list[tuple[str, str, float, str]] = field(default_factory=list)
    reconnects: int = 0  # how many times the stream came back

    def describe(self) -> str:
        return f"coordinator connection of node {self.node_id}"

    def move(self, new: ConnectionState, reason: str) -> None:
        _transition(self, CONNECTION_TRANSITIONS, new, now=time.time(), reason=reason)


