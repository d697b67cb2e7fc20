"""One transition mechanism for every explicit state machine in RollMux.

Each lifecycle (job, permit, node, sidecar connection, rank lease, state cache) declares a str
enum and one table mapping each state to its allowed successors; these helpers refuse any other
edge with an error naming the record, the edge and what is allowed, and record
(from, to, time, reason) on the record. Subsystems pass their own error class (a subclass of
`IllegalTransitionError` in their hierarchy) so callers can catch at the boundary they know.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from rollmux.core.errors import RollMuxError

S = TypeVar("S", bound=Enum)

HISTORY_LIMIT = 8
"""Transitions kept per record by `transition` (oldest dropped)."""


class IllegalTransitionError(RollMuxError):
    """A state machine was asked for an edge its transition table does not allow (a bug or a race)."""


def check_transition(table: Mapping[S, frozenset[S]], current: S, new: S, what: str, *, hint: str = "",
                     error: type[IllegalTransitionError] = IllegalTransitionError) -> None:
    """Raise `error` unless `current -> new` is an edge of `table`.

    Args:
        table: the lifecycle's transition table.
        current: the record's state now.
        new: the requested state.
        what: names the record in the message (e.g. "permit 12 of job a").
        hint: what the caller should do, appended to the message.
        error: the subsystem's subclass of `IllegalTransitionError` to raise.

    Raises:
        IllegalTransitionError: (or `error`) the edge is not in the table.
    """
    if new in table[current]:
        return
    allowed = sorted(s.value for s in table[current]) or ["none (terminal)"]
    message = (f"{what}: illegal transition {current.value} -> {new.value}; "
               f"allowed from {current.value}: {', '.join(allowed)}")
    raise error(f"{message}. {hint}" if hint else message)


def transition(record: Any, table: Mapping[S, frozenset[S]], new: S, *, now: float, reason: str,
               error: type[IllegalTransitionError] = IllegalTransitionError,
               history_limit: int = HISTORY_LIMIT) -> None:
    """Move `record.state` to `new` through `table`, appending (from, to, time, reason) to `record.history`.

    Args:
        record: an object with `state`, `history` (a list) and `describe()`.
        table: the lifecycle's transition table.
        new: the target state.
        now: time of the event, seconds.
        reason: the event, kept in the history.
        error: the subsystem's subclass of `IllegalTransitionError` to raise.
        history_limit: transitions kept on the record.

    Raises:
        IllegalTransitionError: (or `error`) the edge is not in the table; the record is unchanged.
    """
    current = record.state
    if new not in table[current]:  # describe the record only when refusing (this runs per permit)
        check_transition(table, current, new, record.describe(), error=error)
    record.state = new
    record.history.append((current.value, new.value, round(now, 3), reason))
    del record.history[:-history_limit]
