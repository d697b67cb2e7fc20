"""Example phase hooks for ``--phase-hook`` (the seam the RollMux shim plugs into).

``recording_hook`` appends one JSON line per phase (process role, phase, start and end on the
monotonic clock) to the file named by ``TINY_GRPO_PHASE_LOG``; tests use it to check the seam, and it
shows the shape a gate must have: a factory taking the phase name and returning a context manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

import torch.distributed as dist

PHASE_LOG_ENV = "TINY_GRPO_PHASE_LOG"
"""File that ``recording_hook`` appends to; unset means record nothing."""


@contextlib.contextmanager
def recording_hook(phase: str) -> Iterator[None]:
    """Record the phase's start and end (monotonic seconds) with the process's rank."""
    start = time.monotonic()
    try:
        yield
    finally:
        path = os.environ.get(PHASE_LOG_ENV)
        if path:
            rank = dist.get_rank() if dist.is_initialized() else -1
            record = {"rank": rank, "phase": phase, "start": start, "end": time.monotonic()}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
