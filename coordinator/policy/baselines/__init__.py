"""Baselines from the paper, behind the same interfaces as RollMux.

Group placements (`PlacementPolicy`, registered by name on import): ``solo-d``, ``random``,
``most-idle``, ``opt``. Job-level allocations (no groups): Colocate (veRL) and Gavel+, in
`dedicated`; the simulator runs them behind the same `SimStrategy` protocol.
"""

from rollmux.coordinator.policy.baselines.dedicated import (
    DedicatedAllocation,
    colocated,
    gavel_plus,
    solo_d_allocation,
)
from rollmux.coordinator.policy.baselines.most_idle import MostIdlePolicy, idle_fraction
from rollmux.coordinator.policy.baselines.opt import OptPolicy
from rollmux.coordinator.policy.baselines.random_policy import RandomPolicy
from rollmux.coordinator.policy.baselines.solo_d import SoloDPolicy

__all__ = [
    "DedicatedAllocation",
    "MostIdlePolicy",
    "OptPolicy",
    "RandomPolicy",
    "SoloDPolicy",
    "colocated",
    "gavel_plus",
    "idle_fraction",
    "solo_d_allocation",
]
