"""Opt: replay the offline optimum's partition as arrivals come in.

`optimal_partition` (core policy) finds the cheapest grouping of a small job set with all jobs
known at once. This policy places each arriving job where that partition puts it: the first
arriving member of an optimal group creates it with the group's full training pool, later members
join on the rollout nodes the optimum pins them to. It is a lower bound on cost when all jobs
arrive together, which is how the paper compares against it.
"""

from __future__ import annotations

from rollmux.coordinator.policy.api import PlacementDecision, PolicyError, Strategy
from rollmux.coordinator.policy.optimum import OptimalPartition
from rollmux.coordinator.policy.state import ClusterState, GroupState
from rollmux.core.model import JobSpec, Pool


class OptPolicy:
    name = "opt"

    def __init__(self, partition: OptimalPartition, **_: object) -> None:
        self.partition = partition
        self.group_of = {name: k for k, g in enumerate(partition.groups) for name in g.jobs}

    def _node_ids(self, group: GroupState, k: int) -> dict[int, str]:
        """Optimal rollout-node index -> live node id, rebuilt from the members' pinning."""
        pinning = self.partition.groups[k].pinning
        ids: dict[int, str] = {}
        for name, member in group.members.items():
            pins = sorted(pinning[name])
            ordered = [i for i in pins if i in ids] + [i for i in pins if i not in ids]
            ids.update(zip(ordered, member.rollout_nodes))
        return ids

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision:
        if job.name not in self.group_of:
            raise PolicyError(f"job {job.name} is not in the optimal partition this policy was built with")
        k = self.group_of[job.name]
        opt = self.partition.groups[k]
        cluster = state.cluster
        pins = sorted(opt.pinning[job.name])
        live = next((g for g in state.groups.values() if any(self.group_of.get(m) == k for m in g.members)), None)
        if live is None:
            return PlacementDecision(job=job.name, strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                                     new_rollout_nodes=len(pins), new_train_nodes=opt.train_nodes,
                                     delta_usd_per_h=len(pins) * cluster.node_usd_per_h(Pool.ROLLOUT)
                                     + opt.train_nodes * cluster.node_usd_per_h(Pool.TRAIN))
        ids = self._node_ids(live, k)
        existing = tuple(ids[i] for i in pins if i in ids)
        new = len(pins) - len(existing)
        return PlacementDecision(job=job.name, strategy=Strategy.ROLLOUT_SCALING if new else Strategy.DIRECT_PACKING,
                                 group_id=live.group_id, rollout_nodes=existing, new_rollout_nodes=new,
                                 new_train_nodes=0, delta_usd_per_h=new * cluster.node_usd_per_h(Pool.ROLLOUT))


