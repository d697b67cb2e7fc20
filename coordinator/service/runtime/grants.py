"""Grant queues: which waiting phase gets its nodes next, decided by the policy's grant step.

A job's current phase waits (its permit QUEUED) for the nodes it needs: Rollout on the job's pinned
rollout nodes, Train and Sync on the group's training nodes. On every node the group's jobs take
turns in round-robin member order (`policy.grants`, the order the SLO check and the simulator
assume); the job each node served last is stored (``served/<node>``), its turn follows. Train keeps
the training turn for its Sync, so nothing interleaves with a job's Train and Sync. A job whose
lease lapsed or was revoked is passed over until it asks again.

Work conservation: a free node whose turn's job does not request it (busy in its other phase) is
lent to the job that has waited longest among those that asked for it (``asked_at``;
``grant_step(lend=True)``), so no node idles while a phase that may run there waits; the turn
stays where it was. `policy.grants.grant_step` is the
one source of that order: `step` asks it and hands its grants to the caller (`Leases`), which leases
the nodes.

Owns: `served` (``served/<node>``). Reads the permits and the node liveness; calls nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from rollmux.coordinator.policy.grants import (
    Grant,
    PhaseRequest,
    Ring,
    grant_step,
    group_rings,
    served_after_leaving,
)
from rollmux.coordinator.service.runtime.api import PermitState
from rollmux.coordinator.service.runtime.nodes import NodeLiveness
from rollmux.coordinator.service.runtime.records import JobRecord, dumps
from rollmux.coordinator.service.runtime.state import RuntimeState
from rollmux.coordinator.service.runtime.states import PERMIT_PARKED
from rollmux.core.model import Phase


class GrantQueues:
    """Phases waiting for their nodes, in round-robin turn per node."""

    def __init__(self, state: RuntimeState, liveness: NodeLiveness) -> None:
        self.state = state
        self.liveness = liveness
        self.served: dict[str, str] = {}  # node -> job whose round-robin turn there ended last (policy.grants)

    def rings(self, gid: str) -> dict[str, Ring]:
        """The round-robin rings of a group's nodes with their current turns."""
        return group_rings(self.state.placement.groups[gid], self.served)

    def waiting(self, node_id: str) -> list[str]:
        """Jobs whose queued phase needs `node_id`, in turn order from the current turn."""
        state = self.state
        gid = state.placement.node_group.get(node_id)
        ring = self.rings(gid).get(node_id) if gid is not None else None
        if ring is None:
            return []
        start = ring.order.index(ring.turn)
        order = ring.order[start:] + ring.order[:start]
        return [j for j in order if (p := state.permits.get(j)) is not None and p.state is PermitState.QUEUED
                and node_id in state.phase_nodes(state.jobs[j], p.phase)]

    @property
    def queues(self) -> dict[str, list[str]]:
        """node -> jobs waiting for it (derived; for status and metrics)."""
        out = {n: self.waiting(n) for n in self.state.placement.node_group}
        return {n: q for n, q in out.items() if q}

    def queued_per_node(self) -> dict[str, int]:
        """node -> how many queued phases wait for it: the lengths of `queues`, counted from the queued
        permits alone (O(jobs), no ring walks; the gauge pass reads it every GAUGE_INTERVAL_S)."""
        state = self.state
        out: dict[str, int] = {}
        node_group = state.placement.node_group
        for name, permit in state.permits.items():
            if permit.state is not PermitState.QUEUED:
                continue
            for node_id in state.phase_nodes(state.jobs[name], permit.phase):
                if node_id in node_group:
                    out[node_id] = out.get(node_id, 0) + 1
        return out

    def step(self, gid: str, holder: Mapping[str, str]) -> tuple[Grant, ...]:
        """One grant step in group `gid` (`policy.grants.grant_step`): moves the turns it passed and
        returns the grants to make, each on nodes free in `holder` (node -> job holding it)."""
        state = self.state
        group = state.placement.groups[gid]
        rings = self.rings(gid)
        requests: dict[str, PhaseRequest] = {}
        skip = []
        for name in group.members:
            permit = state.permits.get(name)
            if permit is None:
                continue
            if permit.state is PermitState.QUEUED and not (permit.awaits_ask and not permit.asked_at):
                # Train keeps the turn for its Sync; a co-located Rollout for its Train (same nodes).
                keeps = permit.phase is Phase.TRAIN or (permit.phase is Phase.ROLLOUT and group.members[name].colocated)
                # A Sync (a co-located Train) follows its Train (Rollout) on the nodes it just let go of,
                # whether that phase had the turn or borrowed the nodes.
                continues = permit.phase is Phase.SYNC or (permit.phase is Phase.TRAIN and group.members[name].colocated)
                requests[name] = PhaseRequest(job=name, nodes=state.phase_nodes(state.jobs[name], permit.phase),
                                              keeps_turn=keeps, continues=continues,
                                              ready=permit.asked_at > 0, since=permit.asked_at)
            elif permit.state in PERMIT_PARKED:
                skip.append(name)
        usable = [n for n in rings if self.liveness.usable(n)]
        decided = grant_step(rings, holder, requests, usable=usable, skip=skip, lend=True)
        for node_id, job in decided.served.items():
            self._set_served(node_id, job)
        return decided.grants

    def _set_served(self, node_id: str, job: str | None) -> None:
        if job is None:
            self.served.pop(node_id, None)
        else:
            self.served[node_id] = job
        self.state.put(f"served/{node_id}", (lambda: None) if job is None else (lambda j=job: dumps(j)))

    def leave(self, job: JobRecord) -> None:
        """Pass on the turns a leaving job holds (before the policy forgets it)."""
        for node_id, ring in self.rings(job.group_id).items():
            if job.name in ring.order:
                self._set_served(node_id, served_after_leaving(ring, job.name))

    def clear(self, nodes: list[str]) -> None:
        """Forget the turns of nodes their group released."""
        for n in nodes:
            self._set_served(n, None)

    def restore(self, served: dict[str, str]) -> None:
        """Load the stored turns (coordinator restart)."""
        self.served.update(served)
