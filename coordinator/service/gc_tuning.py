"""Garbage-collector pacing of the coordinator process: short, frequent pauses with a large heap.

The coordinator is one event loop, so a collection pauses every call in flight. At 2,000 jobs its
heap holds about 400,000 tracked objects (records, 4,000 node streams with gRPC's call state and
read chains), and two kinds of garbage churn through it:

- grpc.aio leaves a reference cycle per RPC (5 objects from `_find_method_handler`: its
  `query_handlers` closure, scope, `_HandlerCallDetails`, metadata), which only the collector
  frees: about 2,000 objects/s at 400 permit cycles/s.
- Objects that live one phase or one heartbeat period (a stream's read chain, alive until its next
  message) survive any young collection that runs while they are alive.

With CPython's automatic collection, whatever the thresholds, some collection has to visit those
medium-lived objects: measured 85-120 ms pauses every 8-20 s at 2,000 jobs (young threshold 50,000),
or 30-85 ms middle-generation pauses with smaller ones (docs/design/decisions.md), which set the grant
latency's p99. `PacedCollector` replaces automatic collection:

- Every `interval_s` a task on the event loop collects the youngest generation, then freezes the
  survivors (`gc.freeze()`) into the permanent generation, which no later collection visits. A pass
  therefore visits only what was allocated since the previous one (about 1 ms at 2,000 jobs).
- It runs between callbacks, never inside one, so gRPC's per-RPC cycle (made and dropped within one
  synchronous call) is always already garbage when a pass runs: it is collected, not frozen.
- Frozen objects are still freed by reference counting when dropped. Only a cycle that was alive
  during a pass and died later escapes until the next full pass: measured none in 150 s at 2,000
  jobs (a full pass found 0 garbage among 415,000 frozen objects). As a safety net, and for state
  that really grows, a full pass (`settle()`: unfreeze, collect everything, freeze) runs when the
  heap has grown by `reclaim_growth` since the last one, as CPython's own rule for full
  collections does at 25%. The heap is measured by `sys.getallocatedblocks()`, which costs O(1):
  `gc.get_freeze_count()` walks the whole frozen list (3 ms at 420,000 objects), too slow to ask
  every pass.

Each pass also measures how late it woke up: the event loop's lag, the time every call in flight
waited behind whatever held the loop (or behind the CPU the process did not get), which tells a
stall of the coordinator apart from one in Redis, the network or the caller (`on_lag`).

Process-wide, so only the `rollmux coordinator` command uses it (`server.serve`), never a
coordinator embedded in another program (tests, the demo).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PASS_INTERVAL_S = 0.05
"""Seconds between two young passes: the garbage made in between waits at most this long."""
GIL_SWITCH_INTERVAL_S = 0.0005
"""`sys.setswitchinterval` for the coordinator process. grpc.aio's poller thread takes the GIL to
hand each completed read or write to the event loop; while the loop runs callbacks it holds the GIL,
and CPython makes a waiting thread wait a whole switch interval (5 ms by default) before it asks
the holder to let go, so under load every hand-off can cost up to 5 ms, unseen by the loop-lag
sampler (the loop is busy, not late)."""
RECLAIM_GROWTH = 0.5
"""A full pass runs once the heap (allocated blocks) has grown by this fraction since the last one."""


def settle() -> int:
    """Collect everything once (the frozen objects too), then freeze the survivors out of later
    collections; returns how many are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class PacedCollector:
    """Young collections paced by the event loop, survivors frozen; full passes on growth only."""

    def __init__(self, interval_s: float = PASS_INTERVAL_S, reclaim_growth: float = RECLAIM_GROWTH,
                 on_pause: Callable[[str, float], None] | None = None,
                 on_lag: Callable[[float], None] | None = None) -> None:
        """`on_pause(kind, seconds)` hears every pass ("young" or "full"), `on_lag(seconds)` how late
        each young pass started, e.g. for metrics."""
        if interval_s <= 0 or reclaim_growth <= 0:
            raise ValueError(f"interval_s={interval_s} and reclaim_growth={reclaim_growth} must be > 0")
        self.interval_s = interval_s
        self.reclaim_growth = reclaim_growth
        self.on_pause = on_pause
        self.on_lag = on_lag
        self.passes = 0
        self.full_passes = 0
        self._baseline = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Turn automatic collection off and start pacing on the running loop (idempotent)."""
        if self._task is not None:
            return
        gc.disable()
        self.reclaim()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rollmux-gc-pacer")

    async def stop(self) -> None:
        """Stop pacing and give collection back to CPython's automatic collector."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        gc.unfreeze()
        gc.enable()

    def reclaim(self) -> int:
        """One full pass now (also what a reload of the state calls); returns the frozen count."""
        started = time.perf_counter()
        frozen = settle()
        self._baseline = sys.getallocatedblocks()
        self.full_passes += 1
        took = time.perf_counter() - started
        if self.on_pause:
            self.on_pause("full", took)
        log.info("full collection: %d objects frozen, %.1f ms", frozen, took * 1e3)
        return frozen

    def step(self) -> None:
        """One young pass, then freeze its survivors; a full pass if the heap grew too much."""
        started = time.perf_counter()
        gc.collect(0)
        gc.freeze()
        self.passes += 1
        if self.on_pause:
            self.on_pause("young", time.perf_counter() - started)
        if sys.getallocatedblocks() > self._baseline * (1 + self.reclaim_growth):
            self.reclaim()

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            if self.on_lag:
                self.on_lag(max(0.0, time.monotonic() - due))
            self.step()
