"""The long-tail migration rule (paper §4.3, Fig. 7), one for the live coordinator and the simulator.

A rollout is tail-bound once ``threshold`` of its responses are done. Its remaining requests are then
consolidated onto ``tail_share`` of its rollout units, at least one and never all of them, and the
other units pass to the next rollout in their turn. The job's own Train still waits for its whole
Rollout, so on-policy order is unchanged.

The unit is what the caller can hand on: the live coordinator moves whole nodes (`plan`: which of a
lease's nodes to keep, the ones other jobs wait for released first); the simulator models GPUs
within a node (`kept_share` of the job's rollout GPUs keep running the tail, the rest of the node
passes on at the tail-bound point, `release_after_s`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rollmux.coordinator.policy.api import PolicyError


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationRule:
    threshold: float = 0.8  # share of a rollout's responses done when it is tail-bound
    tail_share: float = 0.125  # share of its rollout units the consolidated tail keeps (1 GPU in 8)

    def __post_init__(self) -> None:
        for name in ("threshold", "tail_share"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise PolicyError(f"migration {name}={v!r} is invalid: expected 0 < value <= 1")

    def tail_bound(self, finished: int, total: int) -> bool:
        return total > 0 and finished / total >= self.threshold

    def kept_units(self, units: int) -> int:
        """Units the consolidated tail keeps: `tail_share` of them rounded up, at least one."""
        return max(1, math.ceil(units * self.tail_share - 1e-9))

    def kept_share(self, units: int) -> float:
        """The share of its units the tail keeps (what the simulator charges the tail's GPU-time at)."""
        return min(1.0, self.kept_units(units) / units) if units > 0 else 1.0

    def release_after_s(self, tail_bound_s: float, roll_s: float, units: int) -> float:
        """When a rollout's units pass on, seconds from its start: at the tail-bound point, delayed by
        the GPU-time its tail still takes on the units it keeps (a work-conserving charge)."""
        return tail_bound_s + self.kept_share(units) * max(0.0, roll_s - tail_bound_s)

    def plan(self, nodes: Sequence[str], waited: Collection[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """Which of a tail-bound rollout's nodes to keep and which to release; None: do not migrate
        (one node, or nobody waits for any of them). Nodes others wait for are released first."""
        if len(nodes) < 2 or not any(n in waited for n in nodes):
            return None
        keep_n = min(len(nodes) - 1, self.kept_units(len(nodes)))
        order = [n for n in nodes if n not in waited] + [n for n in nodes if n in waited]
        return tuple(sorted(order[:keep_n])), tuple(sorted(order[keep_n:]))
