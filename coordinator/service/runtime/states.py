"""The lifecycles as data: one transition table per state machine and one `transition()`.

Each table maps a state to its allowed successors; the comment on each edge names the event that
causes it. `transition()` refuses any other edge and appends (from, to, time, reason) to the record's
history, so an operator can ask how a permit or node got where it is.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from rollmux.coordinator.service.runtime.api import (
    CoordinatorTransitionError,
    JobState,
    NodeState,
    PermitState,
)
from rollmux.core import lifecycle
from rollmux.core.model import RelocationState

S = TypeVar("S", bound=Enum)

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({
        JobState.ADMITTED,  # free nodes can host its placement and it is head of the admission queue
        JobState.REMOVED,  # deregistered or removed by an operator before admission
    }),
    JobState.ADMITTED: frozenset({
        JobState.REMOVED,  # deregistered or removed by an operator
    }),
    JobState.REMOVED: frozenset(),
}
JOB_TERMINAL: frozenset[JobState] = frozenset({JobState.REMOVED})

PERMIT_TRANSITIONS: dict[PermitState, frozenset[PermitState]] = {
    PermitState.QUEUED: frozenset({
        PermitState.GRANTED,  # head of every needed node queue and all those nodes free and ready
        PermitState.CANCELLED,  # job removed
    }),
    PermitState.GRANTED: frozenset({
        PermitState.RELEASED,  # the holder released it with the current epoch
        PermitState.EXPIRED,  # TTL lapsed without a renew, heartbeat or progress report
        PermitState.REVOKED,  # operator removed the job or drained a node under it
        PermitState.CANCELLED,  # job removed
    }),
    PermitState.EXPIRED: frozenset({
        PermitState.QUEUED,  # the job asked for the phase again: back to the tail of the queues
        PermitState.CANCELLED,  # job removed
    }),
    PermitState.REVOKED: frozenset({
        PermitState.QUEUED,  # the job asked for the phase again
        PermitState.CANCELLED,  # job removed
    }),
    PermitState.RELEASED: frozenset(),
    PermitState.CANCELLED: frozenset(),
}
PERMIT_TERMINAL: frozenset[PermitState] = frozenset({PermitState.RELEASED, PermitState.CANCELLED})
PERMIT_PARKED: frozenset[PermitState] = frozenset({PermitState.EXPIRED, PermitState.REVOKED})

NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset({
        NodeState.LOST,  # the sidecar's stream closed, or its heartbeats lapsed
        NodeState.DRAINING,  # operator drain
    }),
    NodeState.LOST: frozenset({
        NodeState.READY,  # the sidecar reconnected, or its heartbeats resumed
        NodeState.DRAINING,  # operator drain
    }),
    NodeState.DRAINING: frozenset({
        NodeState.DRAINED,  # no permit holds it any more
    }),
    NodeState.DRAINED: frozenset(),
}

RELOCATION_TRANSITIONS: dict[RelocationState, frozenset[RelocationState]] = {
    RelocationState.PENDING: frozenset({
        RelocationState.SWITCHED,  # the job acknowledged at an iteration boundary and the move still holds
        RelocationState.EXPIRED,  # its deadline passed unacknowledged: the job keeps its place
        RelocationState.CANCELLED,  # the move no longer saves or fits when acknowledged, or the job left
    }),
    RelocationState.SWITCHED: frozenset(),
    RelocationState.EXPIRED: frozenset(),
    RelocationState.CANCELLED: frozenset(),
}

HISTORY_LIMIT = lifecycle.HISTORY_LIMIT
"""Transitions kept per record (oldest dropped)."""


def check_transition(table: dict[S, frozenset[S]], current: S, new: S, what: str) -> None:
    """Raise `CoordinatorTransitionError` unless `current -> new` is an edge of `table`."""
    lifecycle.check_transition(table, current, new, what, error=CoordinatorTransitionError)


def transition(record: object, table: dict[S, frozenset[S]], new: S, *, now: float, reason: str) -> None:
    """Move `record.state` to `new` through `table`, recording (from, to, time, reason).

    Raises:
        CoordinatorTransitionError: the edge is not in the table; the record is unchanged.
    """
    lifecycle.transition(record, table, new, now=now, reason=reason, error=CoordinatorTransitionError)
