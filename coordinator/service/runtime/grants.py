"""Grants: which waiting phase gets its nodes, decided by the policy's grant step, and the lease it gets.

A job's current phase waits (its permit QUEUED) for the nodes it needs: Rollout on the job's pinned
rollout nodes, Train and Sync on the group's training nodes. On every node the group's jobs take
turns in round-robin member order (`policy.grants`, the order the SLO check and the simulator
assume); the job each node served last is stored (``served/<node>``), its turn follows. Train keeps the training turn for its
Sync, so nothing interleaves with a job's Train and Sync. A job whose lease lapsed or was revoked is
passed over until it asks again. A grant holds every needed node with a lease (cluster-wide
increasing epoch + TTL); at most one permit holds a node.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollmux.coordinator.policy.grants import (
    PhaseRequest,
    Ring,
    grant_step,
    group_rings,
    served_after_leaving,
)
from rollmux.coordinator.service.api import NodeState, PermitState
from rollmux.coordinator.service.records import JobRecord, PermitRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.states import NODE_TRANSITIONS, PERMIT_PARKED, PERMIT_TRANSITIONS, transition
from rollmux.model import Phase


class GrantQueues(RuntimeState):
    """Phases waiting for their nodes, and granting them in round-robin turn."""

    def _grantable(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node_id in self.holder:
            return False
        return self._usable(node_id)

    def _usable(self, node_id: str) -> bool:
        """Ready (which a node is only while its sidecar stream is connected)."""
        node = self.nodes.get(node_id)
        return node is not None and node.state is NodeState.READY and node_id in self.connected

    def _free_node(self, node_id: str, *, announce: bool = True) -> None:
        """Free `node_id`; its sidecar hears a snapshot when `announce` or when the node changed state.

        A job's own release is not announced: the sidecar's ranks ended the phase themselves, and a
        snapshot per release was half of the coordinator's node-stream writes (docs/coordinator.md).
        """
        self.holder.pop(node_id, None)
        self.freed_at[node_id] = self.clock()
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.DRAINING:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.wall(), reason="permit ended")
            self._touch(f"node/{node_id}", node)
            announce = True
        if announce:
            self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))

    def _enqueue(self, permit: PermitRecord) -> None:
        """The permit waits from now (grant latency counts from when its nodes are free after this)."""
        permit.queued_at = self.clock()

    def rings(self, gid: str) -> dict[str, Ring]:
        """The round-robin rings of a group's nodes with their current turns."""
        return group_rings(self.placement.groups[gid], self.served)

    def waiting(self, node_id: str) -> list[str]:
        """Jobs whose queued phase needs `node_id`, in turn order from the current turn."""
        gid = self.placement.node_group.get(node_id)
        ring = self.rings(gid).get(node_id) if gid is not None else None
        if ring is None:
            return []
        start = ring.order.index(ring.turn)
        order = ring.order[start:] + ring.order[:start]
        return [j for j in order if (p := self.permits.get(j)) is not None and p.state is PermitState.QUEUED
                and node_id in self.phase_nodes(self.jobs[j], p.phase)]

    @property
    def queues(self) -> dict[str, list[str]]:
        """node -> jobs waiting for it (derived; for status and metrics)."""
        out = {n: self.waiting(n) for n in self.placement.node_group}
        return {n: q for n, q in out.items() if q}

    def queued_per_node(self) -> dict[str, int]:
        """node -> how many queued phases wait for it: the lengths of `queues`, counted from the queued
        permits alone (O(jobs), no ring walks; the gauge pass reads it every GAUGE_INTERVAL_S)."""
        out: dict[str, int] = {}
        node_group = self.placement.node_group
        for name, permit in self.permits.items():
            if permit.state is not PermitState.QUEUED:
                continue
            for node_id in self.phase_nodes(self.jobs[name], permit.phase):
                if node_id in node_group:
                    out[node_id] = out.get(node_id, 0) + 1
        return out

    def _pump(self, nodes: Iterable[str]) -> None:
        """Run the grant step in every group the touched nodes serve."""
        gids = dict.fromkeys(g for n in nodes if (g := self.placement.node_group.get(n)) is not None)
        for gid in gids:
            self._grant_in_group(gid)

    def _grant_in_group(self, gid: str) -> None:
        group = self.placement.groups[gid]
        rings = self.rings(gid)
        requests: dict[str, PhaseRequest] = {}
        skip = []
        for name in group.members:
            permit = self.permits.get(name)
            if permit is None:
                continue
            if permit.state is PermitState.QUEUED:
                # Train keeps the turn for its Sync; a co-located Rollout for its Train (same nodes).
                keeps = permit.phase is Phase.TRAIN or (permit.phase is Phase.ROLLOUT and group.members[name].colocated)
                requests[name] = PhaseRequest(job=name, nodes=self.phase_nodes(self.jobs[name], permit.phase),
                                              keeps_turn=keeps)
            elif permit.state in PERMIT_PARKED:
                skip.append(name)
        usable = [n for n in rings if self._usable(n)]
        step = grant_step(rings, self.holder, requests, usable=usable, skip=skip)
        for node_id, job in step.served.items():
            self._set_served(node_id, job)
        for g in step.grants:
            self._grant(self.permits[g.job], self.jobs[g.job], g.nodes)

    def _set_served(self, node_id: str, job: str | None) -> None:
        if job is None:
            self.served.pop(node_id, None)
        else:
            self.served[node_id] = job
        self._touch_served(node_id)

    def _leave_rings(self, job: JobRecord) -> None:
        """Pass on the turns a leaving job holds (before the policy forgets it)."""
        for node_id, ring in self.rings(job.group_id).items():
            if job.name in ring.order:
                self._set_served(node_id, served_after_leaving(ring, job.name))

    def _grant(self, permit: PermitRecord, job: JobRecord, needed: tuple[str, ...]) -> None:
        self.meta.epoch += 1
        self._touch("meta", self.meta)
        for m in needed:
            self.holder[m] = job.name
        transition(permit, PERMIT_TRANSITIONS, PermitState.GRANTED, now=self.wall(),
                   reason=f"epoch {self.meta.epoch}")
        permit.epoch, permit.nodes, permit.migrated, permit.picked = self.meta.epoch, needed, False, False
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        permit.grantable_at = max([permit.queued_at, *(self.freed_at.get(m, 0.0) for m in needed)])
        self._touch(f"permit/{job.name}", permit)
        self._notify(Notice(kind=NoticeKind.GRANTED, job=job.name, nodes=needed, epoch=permit.epoch))
