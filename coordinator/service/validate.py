"""Range checks for every number a coordinator RPC carries, each refusing with INVALID_ARGUMENT.

Job specs carry their own ranges (`rollmux.core.model`, checked when the spec is built); these are the
per-call numbers: waits, measured durations and what a node reports about itself. Pure functions
over plain values, called by the servicer before anything changes.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping

from rollmux.coordinator.service.runtime.api import InvalidArgumentError
from rollmux.core.model import MAX_PHASE_S, MAX_STATE_BYTES

MAX_TIMEOUT_S = 86_400.0
"""Longest wait a call may ask for (a day; the server's `--max-wait` then clamps it)."""
MAX_NODE_GPUS = 1024
"""Most GPUs one node may report."""
MAX_NODE_DRAM_BYTES = MAX_STATE_BYTES
"""Most host DRAM one node may report (1 PiB)."""
MAX_FACT_KEY = 128
MAX_FACT_VALUE = 1024
"""Longest NVML fact key and value a node may report (characters)."""
REQUEST_ID_KEY = "x-request-id"
"""Metadata a caller may set to correlate its call with the coordinator's log."""


def timeout(value: float) -> float:
    """A requested wait: finite, >= 0 and at most `MAX_TIMEOUT_S`."""
    if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_S):
        raise InvalidArgumentError(f"timeout_s={value} is invalid: expected a finite number >= 0 and "
                                   f"<= {MAX_TIMEOUT_S:g}")
    return value


def duration(value: float, *, held_s: float | None, max_wait_s: float) -> float:
    """A measured phase duration: finite, >= 0, at most a day and, while the lease is known, no
    longer than the lease has been held plus the wait limit (slack for the caller's clock).

    Args:
        value: the reported duration, s.
        held_s: how long the lease being released has been held (None: not the current lease).
        max_wait_s: the server's wait limit.
    """
    if not (math.isfinite(value) and 0 <= value <= MAX_PHASE_S):
        raise InvalidArgumentError(f"duration_s={value} is invalid: expected a finite number >= 0 and "
                                   f"<= {MAX_PHASE_S:g} (a day)")
    if held_s is not None and value > held_s + max_wait_s:
        raise InvalidArgumentError(f"duration_s={value:g} is invalid: the lease has been held {held_s:.3g}s, so "
                                   f"the phase cannot have lasted more than {held_s + max_wait_s:.3g}s (held time "
                                   "plus the server's wait limit)")
    return value


def held_s(history: Iterable[tuple[str, str, float, str]], now_wall: float) -> float | None:
    """Seconds since the last transition to GRANTED in a permit's history (None: none recorded)."""
    granted = [t for _, to, t, _ in history if to == "granted"]
    return max(0.0, now_wall - granted[-1]) if granted else None


def node_facts(gpu_count: int, host_dram_bytes: int, nvml: Mapping[str, str], max_entries: int) -> None:
    """What a node reports about itself: GPU count, host DRAM and its NVML facts."""
    if not 0 < gpu_count <= MAX_NODE_GPUS:
        raise InvalidArgumentError(f"gpu_count={gpu_count} is invalid: expected 1..{MAX_NODE_GPUS}")
    if not 0 < host_dram_bytes <= MAX_NODE_DRAM_BYTES:
        raise InvalidArgumentError(f"host_dram_bytes={host_dram_bytes} is invalid: expected 1..{MAX_NODE_DRAM_BYTES}")
    if len(nvml) > max_entries:
        raise InvalidArgumentError(f"nvml has {len(nvml)} entries: expected at most {max_entries}")
    for key, value in nvml.items():
        if not key or len(key) > MAX_FACT_KEY or len(value) > MAX_FACT_VALUE:
            raise InvalidArgumentError(f"nvml fact {key[:40]!r} is invalid: expected a key of 1..{MAX_FACT_KEY} and "
                                       f"a value of at most {MAX_FACT_VALUE} characters")


def request_id(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The caller's request id (sanitised), or a fresh one."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            if 0 < len(text) <= 64 and text.isprintable():
                return text
    return secrets.token_hex(8)
