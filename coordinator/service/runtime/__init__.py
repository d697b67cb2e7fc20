"""The coordinator's runtime state and every transition on it, with no I/O.

`Runtime` holds the cluster as the coordinator sees it (nodes, jobs, the policy's groups, per-node
FIFO queues, permits and their leases) and changes it only through its methods. Each method
validates first and raises a `ServiceError` before touching anything, then mutates, marks the
records it changed dirty and queues `Notice`s. The shell (`server.py`) takes the dirty records and
commits them to the store in one atomic batch before it answers, and delivers the notices to node
streams and waiting jobs. Time is injected (`clock`, monotonic seconds) so tests drive TTLs.

One responsibility per module, each a layer of `Runtime`:

| module         | responsibility                                                         |
|----------------|------------------------------------------------------------------------|
| `state`        | records, change tracking, lookups, `Notice`                            |
| `grants`       | per-node queues and grants (which queued phase gets its nodes)         |
| `admission`    | job registration, admission by the placement policy, removal           |
| `nodes`        | node registration and liveness (streams, heartbeats, drain)            |
| `leases`       | acquire, renew, release, expiry of permits and their leases            |
| `migration`    | long-tail migration of a tail-bound rollout                            |
| this module    | `Runtime`: wait reasons, invariants, stored form and reload            |

Runtime semantics (DESIGN.md, Intra-group scheduler):
- A job's phase waits in the FIFO queue of every node it needs: Rollout on the job's pinned rollout
  nodes, Train and Sync on the group's training nodes. A job's next phase is enqueued the moment its
  previous one is released, so each node serves its jobs in the round-robin order of the
  meta-iteration while granting the next phase as soon as the node is free (work-conserving). Sync
  continues Train: it goes to the head of the training queues, so nothing interleaves with it.
- A job is enqueued on all its nodes in one step, so any two jobs are in the same relative order in
  every queue they share: no cyclic wait.
- A grant holds every needed node with a lease (cluster-wide increasing epoch + TTL). At most one
  permit holds a node (`holder`), the safety invariant `check_invariants` asserts.
"""

from __future__ import annotations

import json

from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.service.api import JobState, NodeState, PermitState, ServiceConfig
from rollmux.coordinator.service.records import GroupRecord, JobRecord, Meta, NodeRecord, PermitRecord, dumps
from rollmux.coordinator.service.runtime.leases import ReleaseResult
from rollmux.coordinator.service.runtime.migration import Migration, MigrationDecision
from rollmux.coordinator.service.runtime.state import Clock, Notice, NoticeKind
from rollmux.coordinator.service.states import NODE_TRANSITIONS, PERMIT_PARKED, transition
from rollmux.model import ClusterSpec, JobSpec


class Runtime(Migration):
    """All live coordinator state; see the module docstring for the semantics."""

    def wait_reason(self, name: str) -> str:
        """Why a job's permit is not granted yet, naming the blocker."""
        job = self.job(name)
        if job.state is JobState.PENDING:
            pos = self.pending().index(name) + 1
            return (f"job {name!r} is pending admission (position {pos}): the free nodes cannot host its "
                    "placement yet")
        permit = self.permits[name]
        if permit.state in PERMIT_PARKED:
            return f"job {name!r} {permit.phase.value}({permit.iteration}) lease {permit.state.value}"
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.get(n, [])
            if q and q[0] != name:
                return (f"{permit.phase.value}({permit.iteration}) queued at position {q.index(name) + 1} on "
                        f"node {n} behind job {q[0]!r}")
            if n in self.holder and self.holder[n] != name:
                return f"{permit.phase.value}({permit.iteration}) waits for node {n} held by job {self.holder[n]!r}"
            if not self._grantable(n) and n not in self.holder:
                return f"{permit.phase.value}({permit.iteration}) waits for node {n} ({self.nodes[n].state.value}, " \
                       f"{'connected' if n in self.connected else 'sidecar not connected'})"
        return f"{permit.phase.value}({permit.iteration}) {permit.state.value}"


    def check_invariants(self) -> None:
        """Mutual exclusion and queue consistency; raises AssertionError naming the violation."""
        held: dict[str, str] = {}
        for p in self.permits.values():
            if p.state is PermitState.GRANTED:
                for n in p.nodes:
                    assert n not in held, f"node {n} held by both {held[n]} and {p.job}"
                    held[n] = p.job
        assert held == self.holder, f"holder map {self.holder} disagrees with leases {held}"
        for n, q in self.queues.items():
            assert len(q) == len(set(q)), f"queue {n} repeats a job: {q}"
            for j in q:
                assert self.permits[j].state is PermitState.QUEUED, f"{j} in queue {n} but not queued"

    def records(self) -> dict[str, str]:
        """Every record in stored form (to seed a store)."""
        out = {"meta": self.meta.to_json()}
        out.update({f"node/{k}": v.to_json() for k, v in self.nodes.items()})
        out.update({f"job/{k}": v.to_json() for k, v in self.jobs.items()})
        out.update({f"permit/{k}": v.to_json() for k, v in self.permits.items()})
        out.update({f"group/{k}": v.to_json() for k, v in self.groups.items()})
        out.update({f"queue/{k}": dumps(v) for k, v in self.queues.items() if v})
        return out

    @classmethod
    def from_records(cls, records: dict[str, str], cluster: ClusterSpec, config: ServiceConfig, *,
                     clock: Clock, wall: Clock, policy: PlacementPolicy | None = None) -> Runtime:
        """Rebuild the runtime from stored records (coordinator restart or store recovery).

        Leases restart their TTL (holders could not renew while the coordinator was away); nodes with
        a sidecar start LOST until their sidecar reconnects.
        """
        rt = cls(cluster, config, clock=clock, wall=wall, policy=policy)
        if "meta" in records:
            rt.meta = Meta.from_json(records["meta"])
        for key, raw in records.items():
            kind, _, ident = key.partition("/")
            if kind == "node":
                rt.nodes[ident] = NodeRecord.from_json(raw)
            elif kind == "job":
                rt.jobs[ident] = JobRecord.from_json(raw)
            elif kind == "permit":
                rt.permits[ident] = PermitRecord.from_json(raw)
            elif kind == "queue":
                rt.queues[ident] = list(json.loads(raw))
            elif kind == "group":
                rt.groups[ident] = GroupRecord.from_json(raw)
        now = clock()
        for p in rt.permits.values():
            p.queued_at = now
            if p.state is PermitState.GRANTED:
                p.expires_at = now + config.lease_ttl_s
                for n in p.nodes:
                    rt.holder[n] = p.job
        for node in rt.nodes.values():
            if node.streams and node.state is NodeState.READY:
                transition(node, NODE_TRANSITIONS, NodeState.LOST, now=wall(), reason="coordinator restarted")
                rt._touch(f"node/{node.node_id}", node)
        rt._restore_placement()
        rt.check_invariants()
        return rt

    def _restore_placement(self) -> None:
        for gid, rec in sorted(self.groups.items(), key=lambda kv: _gid_number(kv[0])):
            members = [(self.jobs[name].spec, tuple(self.jobs[name].rollout_nodes)) for name in rec.members]
            self.placement.restore_group(gid, tuple(rec.train_nodes), tuple(rec.rollout_nodes), members)


def _gid_number(gid: str) -> int:
    digits = "".join(ch for ch in gid if ch.isdigit())
    return int(digits) if digits else 0


def resolved_spec(spec: JobSpec, cluster: ClusterSpec) -> JobSpec:
    """Fill missing times and state sizes with the profiler's estimates."""
    from rollmux.coordinator.profiler import resolve

    return resolve(spec, cluster)




__all__ = ["Clock", "MigrationDecision", "Notice", "NoticeKind", "ReleaseResult", "Runtime", "resolved_spec"]
