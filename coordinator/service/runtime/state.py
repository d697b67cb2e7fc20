"""The records every runtime part shares, their change tracking and lookups.

`RuntimeState` holds the stored records (nodes, jobs, permits), the policy's placement and the
counters, and queues what a transition changed: the records to commit (`touch`, `forget`) and the
`Notice`s to deliver; the shell takes both with `take_changes`. It has no transitions of its own:
each record kind has one owning part, the only one that writes it (see
`rollmux.coordinator.service.runtime` for the table).

Owns: `meta` (through `next_epoch` and `next_seq`), the change set and the notices. Calls nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.service.runtime.api import JobState, NodeState, NotFoundError, ServiceConfig
from rollmux.coordinator.service.runtime.records import JobRecord, Meta, NodeRecord, PermitRecord
from rollmux.core.model import ClusterSpec, Phase

Clock = Callable[[], float]


def live_policy_config(config: ServiceConfig, *, max_group_size: int = 5) -> PolicyConfig:
    """The placement knobs a live coordinator runs with: `ServiceConfig.policy` (`PolicyConfig.live`
    unless the operator switched a mechanism), with the server's group size."""
    return replace(config.policy, max_group_size=max_group_size)


class NoticeKind(str, Enum):
    GRANTED = "granted"  # a permit was granted (wake the job, tell its nodes)
    REVOKED = "revoked"  # a lease ended other than by release (expired, drained, job removed)
    MIGRATE = "migrate"  # long-tail migration directive
    RELOCATE = "relocate"  # a relocation directive was issued, switched, expired or cancelled
    NODE = "node"  # a node's state or holder changed (re-send its snapshot)
    JOB = "job"  # a job's admission or permit changed (wake its waiters)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    """Something the shell must tell node streams or waiting jobs after the commit."""

    kind: NoticeKind
    job: str = ""
    nodes: tuple[str, ...] = ()  # nodes whose sidecars should hear of it
    epoch: int = 0
    reason: str = ""
    keep_nodes: tuple[str, ...] = ()  # MIGRATE only
    release_nodes: tuple[str, ...] = ()  # MIGRATE only


class RuntimeState:
    """The shared records, the change set and lookups (no transitions)."""

    def __init__(self, cluster: ClusterSpec, config: ServiceConfig, *, clock: Clock,
                 wall: Clock, policy: PlacementPolicy | None = None) -> None:
        self.cluster = cluster
        self.config = config
        self.clock = clock  # monotonic seconds (lease deadlines)
        self.wall = wall  # seconds since the epoch (histories)
        self.policy = policy or RollMuxPolicy(live_policy_config(config))
        self.meta = Meta()  # written by `next_epoch` and `next_seq` only
        self.nodes: dict[str, NodeRecord] = {}  # written by NodeLiveness
        self.jobs: dict[str, JobRecord] = {}  # written by Admission (`moves` by Relocations)
        self.permits: dict[str, PermitRecord] = {}  # job -> its current permit; written by Leases
        # the policy's groups: membership written by Admission, profiles by PhaseLearning, node
        # availability follows the node records (`touch`)
        self.placement = ClusterState(cluster)
        self.capacity_version = 0  # bumped by `capacity_changed`
        self._dirty: dict[str, Callable[[], str | None]] = {}
        self._notices: list[Notice] = []

    # ------------------------------------------------------------------------------------------
    # change tracking
    # ------------------------------------------------------------------------------------------
    def take_changes(self) -> tuple[dict[str, str | None], list[Notice]]:
        """The records changed since the last call (key -> JSON, None = delete) and the notices."""
        writes = {k: render() for k, render in self._dirty.items()}
        notices = self._notices
        self._dirty, self._notices = {}, []
        return writes, notices

    def touch(self, key: str, record: object | None) -> None:
        """Store `record` under `key` at the next commit (rendered then); None deletes the key."""
        self._dirty[key] = (lambda: None) if record is None else record.to_json  # type: ignore[attr-defined]
        if isinstance(record, NodeRecord):  # the policy's snapshot follows the node records
            self.placement.set_node(record.node_id, host_dram_bytes=record.host_dram_bytes,
                                    available=record.state is NodeState.READY)
            self.capacity_changed()

    def capacity_changed(self) -> None:
        """What admission decides on changed (a node record, a group's membership, a member's profile, a
        measured iteration):
        a pending job that did not fit before may fit now (`Admission.try_admit` looks at it again)."""
        self.capacity_version += 1

    def put(self, key: str, render: Callable[[], str | None]) -> None:
        """Store what `render` returns under `key` at the next commit (None deletes the key)."""
        self._dirty[key] = render

    def forget(self, key: str) -> None:
        """Delete `key` at the next commit."""
        self._dirty[key] = lambda: None

    def notify(self, notice: Notice) -> None:
        self._notices.append(notice)

    def next_epoch(self) -> int:
        """A new cluster-wide fencing epoch (leases, directives, memberships)."""
        self.meta.epoch += 1
        self.touch("meta", self.meta)
        return self.meta.epoch

    def next_seq(self) -> int:
        """A new arrival sequence number (admission order)."""
        self.meta.seq += 1
        self.touch("meta", self.meta)
        return self.meta.seq

    def restore(self, meta: Meta | None, jobs: dict[str, JobRecord]) -> None:
        """Load the stored counters and job records (coordinator restart)."""
        if meta is not None:
            self.meta = meta
        self.jobs.update(jobs)

    # ------------------------------------------------------------------------------------------
    # lookups (raise NotFound)
    # ------------------------------------------------------------------------------------------
    def job(self, name: str) -> JobRecord:
        try:
            return self.jobs[name]
        except KeyError:
            raise NotFoundError(f"job {name!r} is not registered (deregistered, removed, or never "
                                "registered): register it first") from None

    def node(self, node_id: str) -> NodeRecord:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise NotFoundError(f"node {node_id!r} is not registered: start its sidecar, which "
                                "registers it") from None

    def pending(self) -> list[str]:
        return sorted((j.name for j in self.jobs.values() if j.state is JobState.PENDING),
                      key=lambda n: self.jobs[n].seq)

    def phase_nodes(self, job: JobRecord, phase: Phase) -> tuple[str, ...]:
        """The nodes `phase` of an admitted job runs on, from the placement (the one record of it)."""
        group = self.placement.groups.get(job.group_id)
        if group is None or job.name not in group.members:
            return ()
        member = group.members[job.name]
        if phase is Phase.ROLLOUT and not member.colocated:
            return member.rollout_nodes
        return member.train_nodes  # Train and Sync, and a co-located job's Rollout: its own training nodes

    def job_nodes(self, job: JobRecord) -> tuple[str, ...]:
        """Every node an admitted job's phases run on (rollout first)."""
        return tuple(dict.fromkeys([*self.phase_nodes(job, Phase.ROLLOUT), *self.phase_nodes(job, Phase.TRAIN)]))
