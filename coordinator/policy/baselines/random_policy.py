"""Random: a uniformly random feasible group (or a new one) and random rollout nodes in it.

The paper's first packing baseline: it respects physical limits (group size, training-pool
size, host DRAM) but not SLOs. Pure: the random stream is derived from the policy's seed and the
job's name, so the same inputs always give the same decision.
"""

from __future__ import annotations

import random

from rollmux.coordinator.policy.api import PlacementDecision, PolicyConfig
from rollmux.coordinator.policy.baselines.common import has_room, isolated, join, roomy_nodes
from rollmux.coordinator.policy.state import ClusterState
from rollmux.core.model import JobSpec


class RandomPolicy:
    name = "random"

    def __init__(self, config: PolicyConfig | None = None, seed: int = 0, **_: object) -> None:
        self.config = config or PolicyConfig()
        self.seed = seed

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision:
        rng = random.Random(f"{self.seed}:{job.name}")
        options = [g for g in state.groups.values() if has_room(g, job, self.config)]
        pick = rng.randrange(len(options) + 1)  # the last slot is "a new group"
        if pick == len(options):
            return isolated(job, state.cluster)
        group = options[pick]
        need = state.cluster.nodes_for(job.n_rollout_gpus)
        roomy = [n.node_id for n in roomy_nodes(group, job)]
        chosen = rng.sample(roomy, min(need, len(roomy)))
        return join(job, group, chosen, state)


