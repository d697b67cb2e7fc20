"""Solo-D: every job alone on dedicated disaggregated pools (its own N_R rollout + N_T training GPUs).

The paper's main cost baseline. It is a placement that always isolates, so it runs through the
same driver as RollMux and shows the dependency bubbles of one job per pair of pools.
"""

from __future__ import annotations

from rollmux.coordinator.policy.api import PlacementDecision
from rollmux.coordinator.policy.baselines.common import isolated
from rollmux.coordinator.policy.state import ClusterState
from rollmux.core.model import JobSpec


class SoloDPolicy:
    name = "solo-d"

    def __init__(self, **_: object) -> None:
        pass

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision:
        return isolated(job, state.cluster)


