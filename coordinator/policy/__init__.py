"""The pure scheduling policy: placement (Algorithm 1), intra-group schedule, offline optimum.

Policies are built by name with `rollmux.coordinator.policy.registry.create_policy`.
"""

from rollmux.coordinator.policy.api import (
    PlacementDecision,
    PlacementPolicy,
    PolicyConfig,
    PolicyError,
    Rejection,
    RejectReason,
    Strategy,
)
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.state import ClusterState, GroupState

__all__ = [
    "ClusterState",
    "GroupState",
    "PlacementDecision",
    "PlacementPolicy",
    "PolicyConfig",
    "PolicyError",
    "RejectReason",
    "Rejection",
    "RollMuxPolicy",
    "Strategy",
]
