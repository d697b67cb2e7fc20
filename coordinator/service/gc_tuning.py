"""Garbage-collector settings of the coordinator process: few, short pauses with a large heap.

The coordinator is one event loop, so a collection pauses every call in flight. With thousands of
jobs its heap holds some 100 tracked objects per node stream (gRPC's call state, the stream's
tasks and queue) besides the records: about 400,000 objects at 2,000 jobs. CPython's defaults
(collect the youngest generation every 700 allocations) move the objects of every call still in
flight into the oldest generation, so a full collection, which visits every tracked object
(tens of ms at that size, more on a busy machine), came every few seconds under load and set the
grant latency's p99. The settings here:

- `tune()`: collect the youngest generation every `GEN0_THRESHOLD` allocations instead of 700.
  Objects of a call that ends within that many allocations die young and are never promoted, so
  the oldest generation grows only with state that really lives, and full collections become rare
  (CPython still starts one only when the objects promoted since the last exceed 25% of those
  that survived it). A young collection visits at most that many objects: about 1-2 ms.
- `settle()`: after start-up and after each reload of the state, collect once and `gc.freeze()`
  the survivors (modules, the loaded state) into the permanent generation, which no later
  collection visits. Frozen objects are still freed by reference counting when dropped; a
  reference cycle among them stays until the next `settle()`, which unfreezes everything first,
  so the state a reload replaced is collected then.

These are process-wide, so only the `rollmux coordinator` command calls them (`server.serve`),
never a coordinator embedded in another program (tests, the demo).
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
"""Allocations (net of deallocations) between two collections of the youngest generation."""
GEN1_THRESHOLD = 20
"""Youngest-generation collections between two of the middle generation."""
GEN2_THRESHOLD = 10
"""Middle-generation collections between two full ones (CPython's default; its 25% rule applies too)."""


def tune() -> None:
    """Apply the coordinator's collection thresholds to this process."""
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


def settle() -> int:
    """Collect everything once (the frozen objects too), then freeze the survivors out of later
    collections; returns how many are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
