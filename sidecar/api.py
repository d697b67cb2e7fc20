"""The node sidecar's contracts: its two state machines and the records they guard.

Its errors are the sidecar protocol's (``rollmux.wire.errors``, beside the coordinator's); the one
declared here, :class:`SidecarTransitionError`, never leaves the daemon.

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
from rollmux.core.errors import ErrorCode
from rollmux.wire.errors import SidecarError

S = TypeVar("S", bound=enum.Enum)
HISTORY_LIMIT = 16
"""Transitions kept per record (oldest dropped)."""

# ------------------------------------------------------------------------------------------ errors


class SidecarTransitionError(SidecarError, lifecycle.IllegalTransitionError):
    """A state change the lifecycle's transition table does not allow."""

    code = ErrorCode.RANK_LEASE


def _transition(record: Any, table: dict[S, frozenset[S]], new: S, *, now: float, reason: str) -> None:
    """Move ``record.state`` to `new` through `table` (see `rollmux.core.lifecycle.transition`).

    Raises:
        SidecarTransitionError: the edge is not in the table; the record is unchanged.
    """
    lifecycle.transition(record, table, new, now=now, reason=reason, error=SidecarTransitionError,
                         history_limit=HISTORY_LIMIT)


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


