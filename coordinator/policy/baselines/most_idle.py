"""Greedy Most-Idle: the feasible group with the highest idle fraction, then its most idle nodes.

The paper's second packing baseline. Idle fraction is computed from the planned (worst-case)
round-robin cycle: GPU-seconds the group's phases occupy per meta-iteration over GPU-seconds it
provisions, with the meta-iteration lasting max(T_cycle, T_load). No SLO check; a new group only
when no existing group can take the job.
"""

from __future__ import annotations

from rollmux.coordinator.policy.api import PlacementDecision, PolicyConfig
from rollmux.coordinator.policy.baselines.common import has_room, isolated, join, roomy_nodes
from rollmux.coordinator.policy.state import ClusterState, GroupState
from rollmux.core.model import JobSpec


def idle_fraction(group: GroupState) -> float:
    """Share of the group's GPU-time left idle by its planned schedule (1.0 for an empty group)."""
    period = max(group.t_cycle_s, group.t_load_s)
    if period <= 0:
        return 1.0
    gpn = group.train_gpus // max(1, len(group.train_nodes))
    roll_busy = sum(m.t_roll_s * len(m.rollout_nodes) * gpn for m in group.members.values())
    train_busy = sum(m.t_train_in_group_s for m in group.members.values()) * group.train_gpus
    capacity = (len(group.rollout) * gpn + group.train_gpus) * period
    return 1.0 - (roll_busy + train_busy) / capacity


class MostIdlePolicy:
    name = "most-idle"

    def __init__(self, config: PolicyConfig | None = None, **_: object) -> None:
        self.config = config or PolicyConfig()

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision:
        options = [g for g in state.groups.values() if has_room(g, job, self.config)]
        if not options:
            return isolated(job, state.cluster)
        group = max(options, key=idle_fraction)  # first of equals: the earliest group
        need = state.cluster.nodes_for(job.n_rollout_gpus)
        nodes = sorted(roomy_nodes(group, job), key=lambda n: (n.load_s, n.node_id))
        return join(job, group, [n.node_id for n in nodes[:need]], state)


