"""The policy's view of the cluster: groups with incrementally kept summaries.

`ClusterState` is the snapshot a policy reads and the record a decision is applied to. Each
`GroupState` keeps T_cycle, the training load, per-node rollout load and DRAM use, and the
tightest SLO budget up to date on every join and leave, so a placement never recomputes all
groups. Applying a decision checks the safety invariants (DRAM within capacity, membership
consistent, no node that cannot take work) before it returns.

Node facts come from whoever owns the nodes (`ClusterState.set_node`: the live coordinator passes
each node record's host DRAM and whether it can take work; the simulator leaves the defaults of
`ClusterSpec`). A node that cannot take work (draining, drained or lost) is never a placement
candidate: `RolloutNodeState.available` and `GroupState.train_available` say so to every policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rollmux.coordinator.policy import modes
from rollmux.coordinator.policy.api import PlacementDecision, PolicyError, Strategy
from rollmux.coordinator.policy.intra_group import MemberTiming
from rollmux.core.model import ClusterSpec, Deployment, Group, JobSpec, Placement, Pool


@dataclass(slots=True)
class RolloutNodeState:
    node_id: str
    host_dram_bytes: int  # capacity
    dram_used_bytes: int = 0  # resident state of pinned jobs
    load_s: float = 0.0  # sum of T_roll of pinned jobs
    jobs: list[str] = field(default_factory=list)
    available: bool = True  # False while the node is draining, drained or lost: place nothing on it


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseProfile:
    """The phase times the policy plans a job with: worst case at first, learned once confident."""

    t_roll_s: float  # solo rollout on the job's own N_R rollout-pool GPUs, s
    t_train_s: float  # solo train (sync included) on its own N_T training-pool GPUs, s
    t_solo_s: float  # the solo iteration its SLO is judged against, s
    learned: bool = False  # from measured iterations (coordinator/policy/learning.py)

    @classmethod
    def planned(cls, job: JobSpec) -> PhaseProfile:
        assert job.t_roll_s is not None and job.t_train_s is not None
        return cls(t_roll_s=job.t_roll_s, t_train_s=job.t_train_s, t_solo_s=job.t_solo_s)


@dataclass(slots=True)
class Member:
    spec: JobSpec  # resolved (times and state bytes present)
    rollout_nodes: tuple[str, ...]  # () when co-located
    deployment: Deployment
    train_nodes: tuple[str, ...]  # the group's training nodes its Train (co-located: every phase) runs on
    roll_factor: float  # rollout time in this group over the solo rollout (hardware; 1 when disaggregated)
    train_factor: float  # train time in this group over the solo train (stretch to the pool, hardware)
    switch_roll_s: float  # warm load before each Rollout (co-located only; planned)
    switch_train_s: float  # warm load before each Train (co-located only; planned)
    profile: PhaseProfile

    @property
    def colocated(self) -> bool:
        return self.deployment is not Deployment.DISAGGREGATED

    @property
    def t_roll_s(self) -> float:
        """Rollout duration in the group (on its rollout nodes, or on the training pool when co-located)."""
        return self.profile.t_roll_s * self.roll_factor + self.switch_roll_s

    @property
    def t_train_in_group_s(self) -> float:
        """T_train stretched to the group's training pool (and its GPU type), with its warm load;
        a co-located member's weights stay on its GPUs (no sync over the inter-cluster link)."""
        sync = modes.sync_s(self.spec) if self.colocated else 0.0
        return max(0.0, self.profile.t_train_s - sync) * self.train_factor + self.switch_train_s

    @property
    def train_pool_load_s(self) -> float:
        """Seconds per iteration this member holds the training pool (its Rollout too when co-located)."""
        return self.t_train_in_group_s + (self.t_roll_s if self.colocated else 0.0)

    @property
    def budget_s(self) -> float:
        """SLO x T_solo: the longest co-execution iteration this member accepts."""
        return self.spec.slo * self.profile.t_solo_s

    def timing(self) -> MemberTiming:
        return MemberTiming(name=self.spec.name, t_roll_s=self.t_roll_s, t_train_s=self.t_train_in_group_s,
                            rollout_nodes=self.rollout_nodes, rollout_on_train=self.colocated, train_nodes=self.train_nodes)


class GroupState:
    """One co-execution group and its cached summaries."""

    __slots__ = ("group_id", "train_nodes", "train_gpus", "train_dram_bytes", "train_node_dram_used",
                 "rollout", "members", "train_node_load_s", "t_cycle_s", "min_budget_s", "min_budget_job", "max_node_load_s",
                 "max_member_train_nodes", "train_pool", "train_unavailable", "_cluster")

    def __init__(self, group_id: str, cluster: ClusterSpec, train_nodes: tuple[str, ...],
                 train_dram_bytes: int, train_pool: Pool = Pool.TRAIN) -> None:
        self.group_id = group_id
        self._cluster = cluster
        self.train_pool = train_pool  # where the group's "training" nodes are (ROLLOUT: a co-located H20 group)
        self.train_nodes = train_nodes
        self.train_gpus = len(train_nodes) * cluster.gpus_per_node
        self.train_dram_bytes = train_dram_bytes  # capacity of the smallest training node
        self.train_node_dram_used: dict[str, int] = dict.fromkeys(train_nodes, 0)  # resident state per training node, bytes
        self.rollout: dict[str, RolloutNodeState] = {}
        self.members: dict[str, Member] = {}
        self.train_node_load_s: dict[str, float] = dict.fromkeys(train_nodes, 0.0)  # Train (and co-located Rollout) s queued per node
        self.t_cycle_s = 0.0
        self.min_budget_s = float("inf")
        self.min_budget_job = ""  # the member whose SLO binds first
        self.max_node_load_s = 0.0
        self.max_member_train_nodes = 0  # most training nodes one member needs (N_T); < the pool's after a pool merge
        self.train_unavailable: set[str] = set()  # training nodes that cannot take work now

    def clone(self) -> GroupState:
        """A copy that later joins and leaves do not share: its node states, loads and member table
        are its own; the members themselves (replaced, never changed, by a join) and the price table
        are shared. What a scratch fork of the cluster (`admission._apply`) copies before changing a group."""
        other = GroupState.__new__(GroupState)
        for name in GroupState.__slots__:
            setattr(other, name, getattr(self, name))
        other.train_node_dram_used = dict(self.train_node_dram_used)
        other.train_node_load_s = dict(self.train_node_load_s)
        other.rollout = {n: RolloutNodeState(node_id=r.node_id, host_dram_bytes=r.host_dram_bytes,
                                             dram_used_bytes=r.dram_used_bytes, load_s=r.load_s, jobs=list(r.jobs),
                                             available=r.available) for n, r in self.rollout.items()}
        other.members = dict(self.members)
        other.train_unavailable = set(self.train_unavailable)
        return other

    # -- derived -------------------------------------------------------------------------------
    @property
    def train_load_s(self) -> float:
        """The most work queued on one training node per meta-iteration, s."""
        return max(self.train_node_load_s.values(), default=0.0)

    def train_load_on_s(self, nodes: Iterable[str]) -> float:
        """The most work queued on one of `nodes` per meta-iteration, s (0 on a node new to the group)."""
        return max((self.train_node_load_s.get(n, 0.0) for n in nodes), default=0.0)

    @property
    def train_dram_used_bytes(self) -> int:
        """Resident state on the fullest training node, bytes."""
        return max(self.train_node_dram_used.values(), default=0)

    @property
    def least_train_dram_used_bytes(self) -> int:
        """Resident state on the emptiest training node, bytes (a newcomer needs at least this)."""
        return min(self.train_node_dram_used.values(), default=0)

    def train_dram_on(self, nodes: Iterable[str]) -> int:
        """Resident state on the fullest of `nodes`, bytes (0 on a node new to the group)."""
        return max((self.train_node_dram_used.get(n, 0) for n in nodes), default=0)

    def add_train_nodes(self, node_ids: Iterable[str]) -> None:
        """Grow the training pool by nodes a joining member brings (train scaling)."""
        for n in node_ids:
            if n in self.train_node_load_s:
                raise PolicyError(f"training node {n} is already in group {self.group_id}")
            self.train_nodes += (n,)
            self.train_node_load_s[n] = 0.0
            self.train_node_dram_used[n] = 0
        self.train_gpus = len(self.train_nodes) * self._cluster.gpus_per_node

    @property
    def t_load_s(self) -> float:
        return max(self.train_load_s, self.max_node_load_s)

    @property
    def train_available(self) -> bool:
        """Every training node can take work (a new member would train on all of them)."""
        return not self.train_unavailable

    @property
    def saturated(self) -> bool:
        """Algorithm 1, line 4: prune when T_load >= T_cycle."""
        return bool(self.members) and self.t_load_s >= self.t_cycle_s

    @property
    def usd_per_h(self) -> float:
        c = self._cluster
        return len(self.rollout) * c.node_usd_per_h(Pool.ROLLOUT) + len(self.train_nodes) * c.node_usd_per_h(self.train_pool)

    def timings(self) -> list[MemberTiming]:
        return [m.timing() for m in self.members.values()]

    def stretched_train_s(self, job: JobSpec, deployment: Deployment = Deployment.DISAGGREGATED) -> float:
        """Train time in this group: stretched over the whole pool (linear) only when the job is
        elastic; otherwise on its own GPUs (`modes.world_gpus`), at its solo speed on this pool's GPU type."""
        assert job.t_train_s is not None
        world = modes.world_gpus(job, self._cluster, deployment, self.train_gpus)
        return job.t_train_s * modes.train_factor(job, self._cluster, self.train_pool, world)

    def own_train_nodes(self, job: JobSpec, deployment: Deployment) -> tuple[str, ...]:
        """The training nodes `job` runs on here (its permits name these): all when elastic, else as
        many whole nodes as hold its own GPUs (a fixed world size), the least loaded ones (ties to the
        pool's order), in the pool's order. Why least loaded: training nodes are per-node queues, so a
        job on nodes the other members leave idle trains while they do."""
        k = self._cluster.nodes_for(modes.world_gpus(job, self._cluster, deployment, self.train_gpus))
        if k >= len(self.train_nodes):
            return self.train_nodes
        pos = {n: i for i, n in enumerate(self.train_nodes)}
        chosen = sorted(self.train_nodes, key=lambda n: (self.train_node_load_s[n], pos[n]))[:k]
        return tuple(sorted(chosen, key=pos.__getitem__))

    def allows(self, deployment: Deployment) -> bool:
        """Disaggregated members need a training-pool group; co-located ones run on the group's own pool."""
        if deployment is Deployment.DISAGGREGATED:
            return self.train_pool is Pool.TRAIN
        return modes.pool_of(deployment) is self.train_pool

    def make_member(self, job: JobSpec, rollout_nodes: tuple[str, ...], deployment: Deployment,
                    profile: PhaseProfile | None = None, train_nodes: tuple[str, ...] | None = None) -> Member:
        """`job` as a member of this group in `deployment` (not added), on `train_nodes` (default:
        `own_train_nodes`)."""
        c, pool = self._cluster, self.train_pool
        gpus = modes.world_gpus(job, c, deployment, self.train_gpus)
        colocated = deployment is not Deployment.DISAGGREGATED
        sw_r, sw_t = modes.switch_s(job, c) if colocated else (0.0, 0.0)
        return Member(spec=job, rollout_nodes=() if colocated else rollout_nodes, deployment=deployment,
                      train_nodes=train_nodes if train_nodes is not None else self.own_train_nodes(job, deployment),
                      roll_factor=modes.roll_factor(job, c, pool, gpus) if colocated else 1.0,
                      train_factor=modes.train_factor(job, c, pool, gpus), switch_roll_s=sw_r, switch_train_s=sw_t,
                      profile=profile or PhaseProfile.planned(job))

    # -- mutation ------------------------------------------------------------------------------
    def add_rollout_node(self, node_id: str, host_dram_bytes: int) -> None:
        if node_id in self.rollout:
            raise PolicyError(f"rollout node {node_id} is already in group {self.group_id}")
        self.rollout[node_id] = RolloutNodeState(node_id=node_id, host_dram_bytes=host_dram_bytes)

    def add_member(self, job: JobSpec, rollout_nodes: tuple[str, ...],
                   deployment: Deployment = Deployment.DISAGGREGATED, profile: PhaseProfile | None = None,
                   train_nodes: tuple[str, ...] | None = None) -> Member:
        if not self.allows(deployment):
            raise PolicyError(f"group {self.group_id} on the {self.train_pool.value} pool cannot hold "
                              f"{job.name} {deployment.value}")
        unknown = [n for n in train_nodes or () if n not in self.train_node_load_s]
        if unknown:
            raise PolicyError(f"{job.name} cannot train on node(s) {','.join(unknown)}: not training nodes of "
                              f"{self.group_id} ({','.join(self.train_nodes)})")
        member = self.make_member(job, rollout_nodes, deployment, profile, train_nodes)
        self.members[job.name] = member
        self._add_loads(member)
        return member

    def _add_loads(self, member: Member) -> None:
        job = member.spec
        assert job.rollout_state_bytes is not None and job.train_state_bytes is not None
        for n in member.rollout_nodes:
            node = self.rollout[n]
            node.jobs.append(job.name)
            node.load_s += member.t_roll_s
            node.dram_used_bytes += job.rollout_state_bytes
            self.max_node_load_s = max(self.max_node_load_s, node.load_s)
        for n in member.train_nodes:
            self.train_node_dram_used[n] += job.train_state_bytes + (job.rollout_state_bytes if member.colocated else 0)
        for n in member.train_nodes:
            self.train_node_load_s[n] += member.train_pool_load_s
        self.t_cycle_s = max(self.t_cycle_s, member.t_roll_s + member.t_train_in_group_s)
        if member.budget_s < self.min_budget_s:
            self.min_budget_s, self.min_budget_job = member.budget_s, job.name
        self.max_member_train_nodes = max(self.max_member_train_nodes, self._cluster.nodes_for(job.n_train_gpus))

    def _drop_loads(self, member: Member, release: bool = True) -> list[str]:
        """Take the member's loads off its nodes; with `release`, nodes left empty leave the group."""
        job, name = member.spec, member.spec.name
        released = []
        for n in member.rollout_nodes:
            node = self.rollout[n]
            node.jobs.remove(name)
            node.load_s -= member.t_roll_s
            node.dram_used_bytes -= job.rollout_state_bytes or 0
            if release and not node.jobs:
                del self.rollout[n]
                released.append(n)
        for n in member.train_nodes:
            self.train_node_dram_used[n] -= (job.train_state_bytes or 0) + ((job.rollout_state_bytes or 0) if member.colocated else 0)
        for n in member.train_nodes:
            self.train_node_load_s[n] -= member.train_pool_load_s
        return released

    def _refresh_summaries(self) -> None:
        ms = list(self.members.values())
        self.t_cycle_s = max((m.t_roll_s + m.t_train_in_group_s for m in ms), default=0.0)
        tightest = min(ms, key=lambda m: m.budget_s, default=None)
        self.min_budget_s = tightest.budget_s if tightest else float("inf")
        self.min_budget_job = tightest.spec.name if tightest else ""
        self.max_node_load_s = max((r.load_s for r in self.rollout.values()), default=0.0)
        self.max_member_train_nodes = max((self._cluster.nodes_for(m.spec.n_train_gpus) for m in ms), default=0)

    def remove_member(self, name: str) -> list[str]:
        """Remove a member; returns the nodes left empty (released): rollout nodes no member is pinned
        to, and, while members remain, training nodes none of them trains on (a fixed-world-size
        member never uses them; an elastic one trains on all, so none is released under it)."""
        released = self._drop_loads(self.members.pop(name))
        if self.members:
            used = {n for m in self.members.values() for n in m.train_nodes}
            idle = [n for n in self.train_nodes if n not in used]
            if idle:
                self.train_nodes = tuple(n for n in self.train_nodes if n in used)
                self.train_gpus = len(self.train_nodes) * self._cluster.gpus_per_node
                for n in idle:
                    del self.train_node_load_s[n], self.train_node_dram_used[n]
                    self.train_unavailable.discard(n)
                released += idle
        self._refresh_summaries()
        return released

    def set_profile(self, name: str, profile: PhaseProfile) -> None:
        """Plan member `name` with new phase times (learned), keeping its place in the round-robin order."""
        member = self.members[name]
        self._drop_loads(member, release=False)
        member.profile = profile
        self._add_loads(member)
        self._refresh_summaries()

    def check_invariants(self) -> None:
        """DRAM within capacity on every node; node job lists match member placements."""
        for node in self.rollout.values():
            if node.dram_used_bytes > node.host_dram_bytes:
                raise PolicyError(f"{self.group_id}: rollout node {node.node_id} holds {node.dram_used_bytes} "
                                  f"bytes of state > {node.host_dram_bytes} DRAM")
            for j in node.jobs:
                if node.node_id not in self.members[j].rollout_nodes:
                    raise PolicyError(f"{self.group_id}: node {node.node_id} lists {j} which is not pinned there")
        if self.train_dram_used_bytes > self.train_dram_bytes:
            raise PolicyError(f"{self.group_id}: training nodes hold {self.train_dram_used_bytes} bytes "
                              f"> {self.train_dram_bytes} DRAM")

    def snapshot(self) -> Group:
        return Group(group_id=self.group_id, jobs=tuple(self.members),
                     rollout_nodes=tuple(self.rollout), train_nodes=self.train_nodes,
                     placements=tuple(Placement(job=n, rollout_nodes=m.rollout_nodes)
                                      for n, m in self.members.items()),
                     usd_per_h=self.usd_per_h)


NodeAllocator = Callable[[Pool, int], list[str]]
"""(pool, count) -> ids of fresh nodes to provision."""


class ClusterState:
    """All groups, in creation order (Algorithm 1 breaks ties toward the earlier group)."""

    def __init__(self, cluster: ClusterSpec | None = None) -> None:
        self.cluster = cluster or ClusterSpec()
        self.groups: dict[str, GroupState] = {}  # creation order
        self._unsaturated: dict[str, GroupState] = {}  # index kept on every join/leave
        self.job_group: dict[str, str] = {}
        self.node_group: dict[str, str] = {}  # node -> the group it serves
        self.node_dram: dict[str, int] = {}  # host DRAM per node (set_node); default cluster.host_dram_bytes
        self.unavailable: set[str] = set()  # nodes that cannot take work (set_node)
        self._group_seq = itertools.count()
        self._group_floor = 0  # next group number after restored groups
        self._node_seq = itertools.count()

    @property
    def usd_per_h(self) -> float:
        return sum(g.usd_per_h for g in self.groups.values())

    def unsaturated_groups(self) -> list[GroupState]:
        """Groups that can still take a job (T_load < T_cycle), in creation order."""
        if len(self._unsaturated) < 2:
            return list(self._unsaturated.values())
        return [g for g in self.groups.values() if g.group_id in self._unsaturated]

    def saturated_group_ids(self) -> list[str]:
        return [gid for gid in self.groups if gid not in self._unsaturated]

    def _reindex(self, group: GroupState) -> None:
        if group.group_id in self.groups and not group.saturated:
            self._unsaturated[group.group_id] = group
        else:
            self._unsaturated.pop(group.group_id, None)

    def set_node(self, node_id: str, *, host_dram_bytes: int, available: bool) -> None:
        """Record a node's facts: its host DRAM and whether it can take work now."""
        self.node_dram[node_id] = host_dram_bytes
        (self.unavailable.discard if available else self.unavailable.add)(node_id)
        group = self.groups.get(self.node_group.get(node_id, ""))
        if group is None:
            return
        if node_id in group.rollout:
            group.rollout[node_id].host_dram_bytes = host_dram_bytes
            group.rollout[node_id].available = available
        if node_id in group.train_nodes:
            (group.train_unavailable.discard if available else group.train_unavailable.add)(node_id)
            group.train_dram_bytes = self._train_dram(group.train_nodes)

    def _dram(self, node_id: str) -> int:
        return self.node_dram.get(node_id, self.cluster.host_dram_bytes)

    def _train_dram(self, train_nodes: Iterable[str]) -> int:
        return min((self._dram(n) for n in train_nodes), default=self.cluster.host_dram_bytes)

    def _new_group(self, group_id: str, train_nodes: tuple[str, ...], train_pool: Pool = Pool.TRAIN) -> GroupState:
        group = GroupState(group_id, self.cluster, train_nodes, self._train_dram(train_nodes), train_pool)
        group.train_unavailable = {n for n in train_nodes if n in self.unavailable}
        return group

    def _add_rollout_node(self, group: GroupState, node_id: str) -> None:
        group.add_rollout_node(node_id, self._dram(node_id))
        group.rollout[node_id].available = node_id not in self.unavailable

    def gpus_in_use(self, pool: Pool) -> int:
        per = self.cluster.gpus_per_node
        rollout = pool is Pool.ROLLOUT
        return sum((len(g.rollout) if rollout else 0) + (len(g.train_nodes) if g.train_pool is pool else 0)
                   for g in self.groups.values()) * per

    def _fresh_nodes(self, pool: Pool, count: int) -> list[str]:
        prefix = "r" if pool is Pool.ROLLOUT else "t"
        return [f"{prefix}{next(self._node_seq)}" for _ in range(count)]

    def apply(self, job: JobSpec, decision: PlacementDecision, allocate: NodeAllocator | None = None) -> GroupState:
        """Carry out a decision; `allocate` names new nodes (default: synthetic ids)."""
        if job.name in self.job_group:
            raise PolicyError(f"job {job.name} is already placed in {self.job_group[job.name]}")
        if decision.job != job.name:
            raise PolicyError(f"decision is for {decision.job}, not {job.name}")
        alloc = allocate or self._fresh_nodes
        down = [n for n in decision.rollout_nodes if n in self.unavailable]
        if down:
            raise PolicyError(f"decision pins {job.name} to node(s) {','.join(down)}, which cannot take work")
        if decision.strategy is Strategy.ISOLATED:
            gid = f"g{next(self._group_seq)}"
            pool = decision.train_pool
            group = self._new_group(gid, tuple(alloc(pool, decision.new_train_nodes)), pool)
            self.groups[gid] = group
        else:
            assert decision.group_id is not None
            group = self.groups[decision.group_id]
            if not group.train_available:
                raise PolicyError(f"decision places {job.name} in {group.group_id}, whose training node(s) "
                                  f"{','.join(sorted(group.train_unavailable))} cannot take work")
        new_ids = alloc(Pool.ROLLOUT, decision.new_rollout_nodes) if decision.new_rollout_nodes else []
        for n in new_ids:
            self._add_rollout_node(group, n)
        trains = None
        if decision.strategy is Strategy.TRAIN_SCALING:  # the job brings its own training nodes and trains there
            trains = tuple(alloc(group.train_pool, decision.new_train_nodes))
            group.add_train_nodes(trains)
            group.train_dram_bytes = self._train_dram(group.train_nodes)
            group.train_unavailable |= {n for n in trains if n in self.unavailable}
        group.add_member(job, tuple(decision.rollout_nodes) + tuple(new_ids), decision.deployment, train_nodes=trains)
        group.check_invariants()
        self.job_group[job.name] = group.group_id
        self.node_group.update(dict.fromkeys([*group.train_nodes, *group.rollout], group.group_id))
        self._reindex(group)
        return group

    def restore_group(self, group_id: str, train_nodes: tuple[str, ...], rollout_nodes: tuple[str, ...],
                      members: Iterable[tuple[JobSpec, tuple[str, ...]] | tuple[JobSpec, tuple[str, ...], Deployment]
                                        | tuple[JobSpec, tuple[str, ...], Deployment, tuple[str, ...]]],
                      train_pool: Pool = Pool.TRAIN) -> GroupState:
        """Rebuild a group from durable records (coordinator restart), keeping indexes and ids consistent.

        Members come in round-robin order with their pinned rollout nodes (and their deployment
        mode, disaggregated when left out; and the training nodes they train on, chosen again by
        `GroupState.own_train_nodes` in member order when left out or empty). New group ids continue after the highest restored
        numeric id, so a restored cluster never reuses an id.
        """
        if group_id in self.groups:
            raise PolicyError(f"group {group_id} already exists")
        group = self._new_group(group_id, tuple(train_nodes), train_pool)
        for n in rollout_nodes:
            self._add_rollout_node(group, n)
        for spec, pinned, *rest in members:
            mode = rest[0] if rest else Deployment.DISAGGREGATED
            trains = tuple(rest[1]) if len(rest) > 1 and rest[1] else None
            assert isinstance(mode, Deployment)
            group.add_member(spec, tuple(pinned), mode, train_nodes=trains)
            self.job_group[spec.name] = group_id
        group.check_invariants()
        self.groups[group_id] = group
        self.node_group.update(dict.fromkeys([*group.train_nodes, *group.rollout], group_id))
        self._reindex(group)
        digits = "".join(ch for ch in group_id if ch.isdigit())
        if group_id.startswith("g") and digits == group_id[1:] and digits:
            self._group_floor = max(self._group_floor, int(digits) + 1)
            self._group_seq = itertools.count(self._group_floor)
        return group

    def remove_job(self, name: str) -> list[str]:
        """Job departure: remove it and release emptied nodes (whole group when empty)."""
        gid = self.job_group.pop(name)
        group = self.groups[gid]
        released = group.remove_member(name)
        if not group.members:
            released += list(group.train_nodes) + list(group.rollout)
            del self.groups[gid]
        for n in released:
            self.node_group.pop(n, None)
        self._reindex(group)
        return released

    def snapshot(self) -> list[Group]:
        return [g.snapshot() for g in self.groups.values()]

    def members(self) -> Iterable[Member]:
        for g in self.groups.values():
            yield from g.members.values()
