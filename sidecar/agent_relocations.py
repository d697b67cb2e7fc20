"""The relocation directives a node agent holds for its jobs while they are pending.

A relocation directive goes to the job's ranks attached now; the agent keeps the job's latest one
while it is pending, to replay it to every rank of the job that attaches later (a trainer that
starts after the directive went out, a restarted rank). A job's first rank here also takes the
coordinator's word for it (``GetJob``), which covers directives issued while this node's stream
was down. Not thread-safe: the agent calls it under its lock.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from rollmux.core.model import Relocation, RelocationState


class HeldRelocations:
    """Each job's latest pending directive, in the order heard (the caller holds the agent's lock)."""

    def __init__(self) -> None:
        # job -> (when heard, in `heard` order; its latest relocation directive), kept while pending
        self._held: dict[str, tuple[int, Relocation]] = {}
        self.heard = 0  # how many directives were held so far (a clock for `adopt`)

    def hold(self, d: Relocation) -> None:
        """Keep `d` as its job's directive while it is pending; drop the job's directive once it ends
        (switched, expired, cancelled)."""
        held = self._held.get(d.job)
        if held is not None and held[1].epoch > d.epoch:
            return  # news of an older directive
        if d.state is RelocationState.PENDING:
            self.heard += 1
            self._held[d.job] = (self.heard, d)
        else:
            self._held.pop(d.job, None)

    def adopt(self, job_name: str, known: Relocation | None, heard_before: int) -> None:
        """On a job's first rank here, the coordinator's answer (``GetJob``, asked when `heard_before`
        directives had been heard) replaces what this node's stream said earlier: the stream may have
        been down when a directive was issued or ended, or the job left and was registered again.
        A directive heard on the stream after that call started is kept."""
        held = self._held.get(job_name)
        if held is not None and held[0] > heard_before:
            return
        if known is not None and known.state is RelocationState.PENDING:
            self.heard += 1
            self._held[job_name] = (self.heard, known)
        else:
            self._held.pop(job_name, None)

    def replay(self, job_name: str, inbox: queue.Queue[Any]) -> None:
        """Hand a rank attaching now its job's pending directive, if it is not past its deadline
        (then the coordinator expires it: the job keeps its place)."""
        held = self._held.get(job_name)
        if held is None:
            return
        if held[1].deadline_unix_s <= time.time():
            del self._held[job_name]
            return
        inbox.put(held[1])

    def drop(self, job_name: str) -> None:
        """Forget the job's directive (the job leaves this node)."""
        self._held.pop(job_name, None)


__all__ = ["HeldRelocations"]
