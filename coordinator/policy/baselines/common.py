"""Shared feasibility rules of the group baselines (Random, Most-Idle).

They differ from RollMux in how they choose, not in what is physically possible: a group must
have room (max group size), a training pool at least as large as the job needs (the training
pool is never grown), and host DRAM for the job's state on every node it pins. They do not check
SLOs, as in the paper.
"""

from __future__ import annotations

from rollmux.coordinator.policy.api import PlacementDecision, PolicyConfig, Strategy
from rollmux.coordinator.policy.placement import isolated_cost
from rollmux.coordinator.policy.state import ClusterState, GroupState, RolloutNodeState
from rollmux.core.model import ClusterSpec, JobSpec, Pool


def has_room(group: GroupState, job: JobSpec, config: PolicyConfig) -> bool:
    """Group size, training-pool size and training-node DRAM allow `job` (strict, as Algorithm 1)."""
    assert job.train_state_bytes is not None
    return (group.train_available and len(group.members) < config.max_group_size
            and job.n_train_gpus <= group.train_gpus
            and group.train_dram_used_bytes + job.train_state_bytes < group.train_dram_bytes)


def roomy_nodes(group: GroupState, job: JobSpec) -> list[RolloutNodeState]:
    """Rollout nodes of `group` whose host DRAM still fits the job's rollout state, in node order."""
    assert job.rollout_state_bytes is not None
    return [n for n in group.rollout.values()
            if n.available and n.dram_used_bytes + job.rollout_state_bytes < n.host_dram_bytes]


def isolated(job: JobSpec, cluster: ClusterSpec) -> PlacementDecision:
    """A new group holding only `job` on its own N_R + N_T GPUs."""
    return PlacementDecision(job=job.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                             new_rollout_nodes=cluster.nodes_for(job.n_rollout_gpus),
                             new_train_nodes=cluster.nodes_for(job.n_train_gpus),
                             delta_usd_per_h=isolated_cost(job, cluster))


def join(job: JobSpec, group: GroupState, chosen: list[str], state: ClusterState) -> PlacementDecision:
    """Pin `job` to `chosen` existing rollout nodes of `group`, adding new nodes for the shortfall."""
    cluster = state.cluster
    new = cluster.nodes_for(job.n_rollout_gpus) - len(chosen)
    return PlacementDecision(job=job.name, strategy=Strategy.ROLLOUT_SCALING if new else Strategy.DIRECT_PACKING,
                             group_id=group.group_id, rollout_nodes=tuple(chosen), new_rollout_nodes=new,
                             new_train_nodes=0, delta_usd_per_h=new * cluster.node_usd_per_h(Pool.ROLLOUT))
