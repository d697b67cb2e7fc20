"""`Runtime`: the one object the shell holds, wiring the runtime's parts and sequencing events between them.

Every public method validates (through the part that owns the records) before it changes anything,
and delegates to one part, or, where an event crosses parts, calls them in a fixed order (see the
package docstring). Owns no field of its own; its attributes are the parts. Readers read the parts'
fields directly (`rt.state.jobs`, `rt.leases.holder`, ...); the views the servicer answers with (job
status, the cluster, a node's events, wait reasons) are in `views`.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.service.runtime import stored
from rollmux.coordinator.service.runtime.admission import Admission, Registered
from rollmux.coordinator.service.runtime.api import NodeState, PermitState, ServiceConfig
from rollmux.coordinator.service.runtime.directives import Directives
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.learning import PhaseLearning
from rollmux.coordinator.service.runtime.leases import Leases, ReleaseResult, UnusedNode
from rollmux.coordinator.service.runtime.migration import LongTailMigration
from rollmux.coordinator.service.runtime.nodes import NodeLiveness
from rollmux.coordinator.service.runtime.records import (
    JobRecord,
    NodeRecord,
    PermitRecord,
    RelocationRecord,
)
from rollmux.coordinator.service.runtime.relocation import Relocations
from rollmux.coordinator.service.runtime.state import Clock, Notice, RuntimeState
from rollmux.core.model import ClusterSpec, JobSpec, Migration, Phase, Pool


class Runtime:
    """All live coordinator state; see the package docstring for the parts and the semantics."""

    def __init__(self, cluster: ClusterSpec, config: ServiceConfig, *, clock: Clock,
                 wall: Clock, policy: PlacementPolicy | None = None) -> None:
        self.state = RuntimeState(cluster, config, clock=clock, wall=wall, policy=policy)
        self.liveness = NodeLiveness(self.state)
        self.learning = PhaseLearning(self.state)
        self.grant_queues = GrantQueues(self.state, self.liveness)
        self.leases = Leases(self.state, self.liveness, self.grant_queues, self.learning)
        self.migration = LongTailMigration(self.state, self.leases, self.grant_queues)
        self.directives = Directives(self.state)
        self.admission = Admission(self.state, self.leases, self.grant_queues, self.learning, self.directives)
        self.relocation = Relocations(self.state, self.directives, self.learning, self.admission, self.leases)

    def take_changes(self) -> tuple[dict[str, str | None], list[Notice]]:
        """The records changed and the notices queued since the last call (the shell commits and delivers them)."""
        return self.state.take_changes()

    # ------------------------------------------------------------------------------------- nodes
    def register_node(self, *, node_id: str, pool: Pool, gpu_type: str, gpu_count: int,
                      host_dram_bytes: int, nvml: dict[str, str]) -> NodeRecord:
        return self.liveness.register_node(node_id=node_id, pool=pool, gpu_type=gpu_type, gpu_count=gpu_count,
                                           host_dram_bytes=host_dram_bytes, nvml=nvml)

    def node_connected(self, node_id: str) -> None:
        if self.liveness.connect(node_id):
            self._ready_again(node_id)

    def node_disconnected(self, node_id: str) -> None:
        self.liveness.disconnect(node_id)

    def heartbeat(self, node_id: str, active_epochs: Iterable[int]) -> None:
        """A sidecar heartbeat: a node whose heartbeats had lapsed is READY again, and the lease
        holding the node is renewed if the node runs that epoch."""
        if self.liveness.heard(node_id):
            self._ready_again(node_id)
        self.leases.heartbeat(node_id, active_epochs)

    def _ready_again(self, node_id: str) -> None:
        """A node became READY: grant what waits for it, and admit pending jobs that may fit now."""
        self.leases.grant_waiting([node_id])
        self.admission.try_admit()

    def drain_node(self, node_id: str) -> NodeState:
        """Stop granting on a node and placing jobs on it; the running permit finishes."""
        return self.liveness.drain(node_id, held=node_id in self.leases.holder)

    # -------------------------------------------------------------------------------------- jobs
    def register_job(self, spec: JobSpec, *, token_sha256: str, nonce_sha256: str,
                     relayed_by: str = "", attachable: bool = False) -> tuple[JobRecord, Registered]:
        return self.admission.register_job(spec, token_sha256=token_sha256, nonce_sha256=nonce_sha256,
                                           relayed_by=relayed_by, attachable=attachable)

    def try_admit(self) -> list[str]:
        return self.admission.try_admit()

    def remove_job(self, name: str, *, reason: str) -> list[str]:
        """Remove a job in any state; revokes its lease. Returns the nodes its group released. The
        group it left is then looked at for moves (`Relocations.departed`)."""
        group_id = self.state.job(name).group_id
        released = self.admission.remove_job(name, reason=reason)
        self.relocation.departed(name, group_id)
        return released

    # ------------------------------------------------------------------------------------ leases
    def acquire(self, name: str, phase: Phase, iteration: int) -> PermitRecord | None:
        return self.leases.acquire(name, phase, iteration)

    def renew(self, name: str, epoch: int) -> float:
        return self.leases.renew(name, epoch)

    def release(self, name: str, epoch: int, duration_s: float, *, node_id: str = "") -> ReleaseResult:
        return self.leases.release(name, epoch, duration_s, node_id=node_id)

    def advance(self, name: str, epoch: int, duration_s: float, *,
                node_id: str = "") -> tuple[ReleaseResult, PermitRecord | None]:
        return self.leases.advance(name, epoch, duration_s, node_id=node_id)

    def grant_without_rank(self, node_id: str, name: str, epoch: int) -> UnusedNode:
        return self.leases.grant_without_rank(node_id, name, epoch)

    def report_attach(self, name: str, node_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.admission.report_attach(name, node_id)

    def report_progress(self, name: str, epoch: int, finished: int, total: int) -> Migration | None:
        return self.migration.report_progress(name, epoch, finished, total)

    # -------------------------------------------------------------------------------- relocation
    def plan_relocations(self, group_ids: list[str]) -> RelocationRecord | None:
        return self.relocation.plan_relocations(group_ids)

    def plan_deferred(self) -> RelocationRecord | None:
        return self.relocation.plan_deferred()

    def ack_relocation(self, name: str, epoch: int) -> tuple[RelocationRecord, str]:
        return self.relocation.ack_relocation(name, epoch)

    # --------------------------------------------------------------------------------- deadlines
    def expire(self) -> list[str]:
        """Turn silent nodes LOST, revoke every lease past its TTL, end directives past their deadline
        (the job stays); returns the jobs whose lease expired.

        A node whose stream is open but whose heartbeats lapsed (`ServiceConfig.heartbeat_lapse_s`)
        turns LOST: nothing new is granted on it; its running lease, no longer renewed, expires here
        after its TTL like any other.
        """
        self.liveness.lapse()
        expired = self.leases.expire()
        self.relocation.expire()
        return expired

    def next_deadline(self) -> float | None:
        """The earliest lease expiry, heartbeat lapse or directive deadline (when `expire` would change
        something)."""
        deadlines = (self.liveness.next_lapse(), self.leases.next_expiry(), self.directives.next_deadline())
        return min((d for d in deadlines if d is not None), default=None)

    @property
    def deadline_horizon_s(self) -> float:
        """Every deadline set from now on lies at least this far ahead (TTLs, lapses and directive
        deadlines are constant)."""
        config = self.state.config
        return min(config.lease_ttl_s, config.heartbeat_lapse_s, config.relocation_deadline_s)

    # ------------------------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Mutual exclusion and round-robin turns on members; raises AssertionError naming the violation."""
        state, holder = self.state, self.leases.holder
        held: dict[str, str] = {}
        for p in state.permits.values():
            if p.state is PermitState.GRANTED:
                for n in p.nodes:
                    assert n not in held, f"node {n} held by both {held[n]} and {p.job}"
                    held[n] = p.job
                again = set(p.nodes) & set(p.freed_nodes)
                assert not again, f"{p.describe()} holds node(s) {sorted(again)} it already released"
        assert held == holder, f"holder map {holder} disagrees with leases {held}"
        for p in state.permits.values():  # a lease holds only nodes of its job's group (relocation moved it whole)
            job = state.jobs.get(p.job)
            if p.state is PermitState.GRANTED and job is not None:
                outside = set(p.nodes) - set(state.phase_nodes(job, p.phase))
                assert not outside, f"{p.describe()} holds node(s) {sorted(outside)} outside job {p.job}'s group"
        for n, job_name in self.grant_queues.served.items():
            gid = state.placement.node_group.get(n)
            ring = self.grant_queues.rings(gid).get(n) if gid is not None else None
            assert ring is not None and job_name in ring.order, f"node {n} last served {job_name!r}, not a job using it"

    # ------------------------------------------------------------------------------- stored form
    def records(self) -> dict[str, str]:
        """Every record in stored form (to seed a store)."""
        return stored.records(self.state, self.grant_queues.served, self.directives.relocations,
                              self.learning.learned)

    @classmethod
    def from_records(cls, records: dict[str, str], cluster: ClusterSpec, config: ServiceConfig, *,
                     clock: Clock, wall: Clock, policy: PlacementPolicy | None = None) -> Runtime:
        """Rebuild the runtime from stored records (coordinator restart or store recovery).

        Leases restart their TTL (holders could not renew while the coordinator was away); nodes
        start LOST until their sidecar reconnects.
        """
        rt = cls(cluster, config, clock=clock, wall=wall, policy=policy)
        loaded = stored.parse(records)
        rt.state.restore(loaded.meta, loaded.jobs)
        rt.leases.restore(loaded.permits)
        rt.grant_queues.restore(loaded.served)
        rt.directives.restore(loaded.relocations)
        rt.liveness.restore(loaded.nodes)
        rt.admission.restore_groups(loaded.groups)
        for name in rt.state.jobs:
            rt.learning.restore(name, loaded.learned.get(name))
        rt.check_invariants()
        return rt


def resolved_spec(spec: JobSpec, cluster: ClusterSpec) -> JobSpec:
    """Fill missing times and state sizes with the profiler's estimates."""
    from rollmux.coordinator.policy.profiler import resolve

    return resolve(spec, cluster)
