"""The coordinator's runtime state and every transition on it, with no I/O.

`Runtime` holds the cluster as the coordinator sees it (nodes, jobs, the policy's groups, per-node
round-robin turns, permits and their leases) and changes it only through its methods. Each method
validates first and raises a `ServiceError` before touching anything, then mutates, marks the
records it changed dirty and queues `Notice`s. The shell (`server.py`) takes the dirty records and
commits them to the store in one atomic batch before it answers, and delivers the notices to node
streams and waiting jobs. Time is injected (`clock`, monotonic seconds) so tests drive TTLs.

One responsibility per module, each a layer of `Runtime`:

| module         | responsibility                                                         |
|----------------|------------------------------------------------------------------------|
| `state`        | records, change tracking, lookups, `Notice`                            |
| `grants`       | grants in round-robin turn (`policy.grants.grant_step`), leases given  |
| `admission`    | job registration, admission by the placement policy, removal           |
| `nodes`        | node registration and liveness (streams, heartbeats, drain)            |
| `leases`       | acquire, renew, release, expiry of permits and their leases            |
| `learning`     | measured iterations to the phase learner, learned profiles             |
| `migration`    | long-tail migration of a tail-bound rollout                            |
| `relocation`   | regrouping directives: planned on departures, switched on ack, expired |
| this module    | `Runtime`: wait reasons, invariants, stored form and reload            |

Runtime semantics (DESIGN.md, Intra-group scheduler):
- A job's phase waits for every node it needs: Rollout for the job's pinned rollout nodes, Train and
  Sync for the group's training nodes. A job asks for its next phase the moment its previous one is
  released. On each node the group's jobs take turns in member order, once per meta-iteration
  (`policy.grants.grant_step`, the same step the simulator runs): the schedule the SLO check
  assumes. Train keeps the training turn for its Sync, so nothing interleaves with them.
- Every node's turn order is the group's one member order. Turns on different nodes can still get
  out of step (a crash between two stored writes, joins and departures mid meta-iteration), and two
  waiting jobs can then hold each other's turn; the grant step breaks such a cycle by passing over
  one turn (`policy.grants.deadlock_edge`), so a group never stalls on turns alone.
- A grant holds every needed node with a lease (cluster-wide increasing epoch + TTL). At most one
  permit holds a node (`holder`), the safety invariant `check_invariants` asserts.
"""

from __future__ import annotations

import json

from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.policy.grants import current_turn
from rollmux.coordinator.service.api import JobState, NodeState, PermitState, ServiceConfig
from rollmux.coordinator.service.records import (
    GroupRecord,
    JobRecord,
    Meta,
    NodeRecord,
    PermitRecord,
    RelocationRecord,
    dumps,
)
from rollmux.coordinator.service.runtime.admission import group_record
from rollmux.coordinator.service.runtime.leases import ReleaseResult
from rollmux.coordinator.service.runtime.relocation import Relocations
from rollmux.coordinator.service.runtime.state import Clock, Notice, NoticeKind
from rollmux.coordinator.service.states import NODE_TRANSITIONS, PERMIT_PARKED, transition
from rollmux.model import ClusterSpec, Deployment, JobSpec, Pool


class Runtime(Relocations):
    """All live coordinator state; see the module docstring for the semantics."""

    def wait_reason(self, name: str) -> str:
        """Why a job's permit is not granted yet, naming the blocker."""
        job = self.job(name)
        if job.state is JobState.PENDING:
            pos = self.pending().index(name) + 1
            return (f"job {name!r} is pending admission (position {pos}): the free nodes cannot host its "
                    "placement yet")
        permit = self.permits.get(name)
        if permit is None:
            return f"job {name!r} has no permit yet"
        if permit.state in PERMIT_PARKED:
            return f"job {name!r} {permit.phase.value}({permit.iteration}) lease {permit.state.value}"
        what = f"{permit.phase.value}({permit.iteration})"
        rings = self.rings(job.group_id) if permit.state is PermitState.QUEUED else {}
        for n in self.phase_nodes(job, permit.phase):
            ring = rings.get(n)
            turn = None if ring is None else current_turn(ring, self._parked())
            if turn is not None and turn != name:
                return (f"{what} waits for its round-robin turn on node {n}: queued behind job {turn!r} "
                        f"(turn order {', '.join(ring.order)})")  # type: ignore[union-attr]
            if n in self.holder and self.holder[n] != name:
                return f"{what} waits for node {n} held by job {self.holder[n]!r}"
            if not self._grantable(n) and n not in self.holder:
                return f"{what} waits for node {n} ({self.nodes[n].state.value}, " \
                       f"{'connected' if n in self.connected else 'sidecar not connected'})"
        return f"{what} {permit.state.value}"

    def _parked(self) -> set[str]:
        return {j for j, p in self.permits.items() if p.state in PERMIT_PARKED}


    def check_invariants(self) -> None:
        """Mutual exclusion and round-robin turns on members; raises AssertionError naming the violation."""
        held: dict[str, str] = {}
        for p in self.permits.values():
            if p.state is PermitState.GRANTED:
                for n in p.nodes:
                    assert n not in held, f"node {n} held by both {held[n]} and {p.job}"
                    held[n] = p.job
        assert held == self.holder, f"holder map {self.holder} disagrees with leases {held}"
        for p in self.permits.values():  # a lease holds only nodes of its job's group (relocation moved it whole)
            job = self.jobs.get(p.job)
            if p.state is PermitState.GRANTED and job is not None:
                outside = set(p.nodes) - set(self.phase_nodes(job, p.phase))
                assert not outside, f"{p.describe()} holds node(s) {sorted(outside)} outside job {p.job}'s group"
        for n, job in self.served.items():
            gid = self.placement.node_group.get(n)
            ring = self.rings(gid).get(n) if gid is not None else None
            assert ring is not None and job in ring.order, f"node {n} last served {job!r}, not a job using it"

    def records(self) -> dict[str, str]:
        """Every record in stored form (to seed a store)."""
        out = {"meta": self.meta.to_json()}
        out.update({f"node/{k}": v.to_json() for k, v in self.nodes.items()})
        out.update({f"job/{k}": v.to_json() for k, v in self.jobs.items()})
        out.update({f"permit/{k}": v.to_json() for k, v in self.permits.items()})
        out.update({f"group/{k}": group_record(g).to_json() for k, g in self.placement.groups.items()})
        out.update({f"served/{k}": dumps(v) for k, v in self.served.items()})
        out.update({f"relocation/{k}": v.to_json() for k, v in self.relocations.items()})
        out.update({f"learn/{k}": dumps(v) for k, v in self.learned.items()})
        return out

    @classmethod
    def from_records(cls, records: dict[str, str], cluster: ClusterSpec, config: ServiceConfig, *,
                     clock: Clock, wall: Clock, policy: PlacementPolicy | None = None) -> Runtime:
        """Rebuild the runtime from stored records (coordinator restart or store recovery).

        Leases restart their TTL (holders could not renew while the coordinator was away); nodes
        start LOST until their sidecar reconnects.
        """
        rt = cls(cluster, config, clock=clock, wall=wall, policy=policy)
        if "meta" in records:
            rt.meta = Meta.from_json(records["meta"])
        groups: dict[str, GroupRecord] = {}
        learned: dict[str, list[list[float]]] = {}
        for key, raw in records.items():
            kind, _, ident = key.partition("/")
            if kind == "node":
                rt.nodes[ident] = NodeRecord.from_json(raw)
            elif kind == "job":
                rt.jobs[ident] = JobRecord.from_json(raw)
            elif kind == "permit":
                rt.permits[ident] = PermitRecord.from_json(raw)
            elif kind == "served":
                rt.served[ident] = json.loads(raw)
            elif kind == "group":
                groups[ident] = GroupRecord.from_json(raw)
            elif kind == "relocation":
                rt.relocations[ident] = RelocationRecord.from_json(raw)
            elif kind == "learn":
                learned[ident] = json.loads(raw)
        now = clock()
        for p in rt.permits.values():
            p.queued_at = now
            if p.state is PermitState.GRANTED:
                p.expires_at = now + config.lease_ttl_s
                p.picked = True  # it may be running: a relocation waits for the next boundary
                for n in p.nodes:
                    rt.holder[n] = p.job
        for node in rt.nodes.values():
            if node.state is NodeState.READY:
                transition(node, NODE_TRANSITIONS, NodeState.LOST, now=wall(), reason="coordinator restarted")
                rt._touch(f"node/{node.node_id}", node)
        for node in rt.nodes.values():  # the policy's snapshot from the node records, before its groups
            rt.placement.set_node(node.node_id, host_dram_bytes=node.host_dram_bytes,
                                  available=node.state is NodeState.READY)
        rt._restore_placement(groups)
        for name in rt.jobs:
            if name in learned:
                rt.restore_learned(name, learned[name])
            else:
                rt._joined(name)
        rt.check_invariants()
        return rt

    def _restore_placement(self, groups: dict[str, GroupRecord]) -> None:
        for gid, rec in sorted(groups.items(), key=lambda kv: _gid_number(kv[0])):
            members = [(self.jobs[name].spec, tuple(self.jobs[name].rollout_nodes), Deployment(self.jobs[name].deployment))
                       for name in rec.members]
            self.placement.restore_group(gid, tuple(rec.train_nodes), tuple(rec.rollout_nodes), members,
                                         train_pool=Pool(rec.train_pool))


def _gid_number(gid: str) -> int:
    digits = "".join(ch for ch in gid if ch.isdigit())
    return int(digits) if digits else 0


def resolved_spec(spec: JobSpec, cluster: ClusterSpec) -> JobSpec:
    """Fill missing times and state sizes with the profiler's estimates."""
    from rollmux.coordinator.profiler import resolve

    return resolve(spec, cluster)




__all__ = ["Clock", "Notice", "NoticeKind", "ReleaseResult", "Runtime", "resolved_spec"]
