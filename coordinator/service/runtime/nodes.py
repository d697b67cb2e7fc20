"""Node registration and liveness: streams, heartbeats, drain.

A node is READY only while its sidecar's stream is open and its heartbeats arrive: a registered node
starts LOST until its stream connects, and turns LOST again when the stream closes or goes silent.
Its GPU type must be one of the coordinator's catalog.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollmux.coordinator.service.api import AlreadyExistsError, InvalidArgumentError, NodeState
from rollmux.coordinator.service.records import NodeRecord
from rollmux.coordinator.service.runtime.admission import Admission
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.coordinator.service.states import NODE_TRANSITIONS, transition
from rollmux.model import Pool


class NodeLiveness(Admission):
    """Registering nodes and following whether their sidecars are alive."""

    def register_node(self, *, node_id: str, pool: Pool, gpu_type: str, gpu_count: int,
                      host_dram_bytes: int, nvml: dict[str, str]) -> NodeRecord:
        """Register a node, or refresh the facts of a known one (a restarted sidecar).

        Raises:
            InvalidArgumentError: the GPU type is not in the catalog.
            AlreadyExistsError: the id is registered in the other pool.
        """
        catalog = self.cluster.catalog
        if gpu_type not in catalog:
            raise InvalidArgumentError(f"node {node_id!r} gpu_type={gpu_type!r} is not in the coordinator's GPU "
                                       f"catalog {sorted(catalog.gpus)}: use one of those names, or start the "
                                       "coordinator with --catalog FILE listing it")
        existing = self.nodes.get(node_id)
        if existing is not None:
            if existing.pool is not pool:
                raise AlreadyExistsError(f"node {node_id!r} is registered in pool {existing.pool.value}, "
                                         f"not {pool.value}: give the node another id")
            existing.gpu_type, existing.gpu_count = gpu_type, gpu_count
            existing.host_dram_bytes, existing.nvml = host_dram_bytes, dict(nvml)
            self._touch(f"node/{node_id}", existing)
            return existing
        node = NodeRecord(node_id=node_id, pool=pool, gpu_type=gpu_type, gpu_count=gpu_count,
                          host_dram_bytes=host_dram_bytes, nvml=dict(nvml))
        transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.wall(),
                   reason="registered; not READY until its sidecar stream connects")
        self.nodes[node_id] = node
        self._touch(f"node/{node_id}", node)
        return node

    def node_connected(self, node_id: str) -> None:
        node = self.node(node_id)
        self.connected.add(node_id)
        node.heard_at = self.clock()
        if not node.streams:
            node.streams = True
            self._touch(f"node/{node_id}", node)
        if node.state is NodeState.LOST:
            self._ready_again(node_id, "sidecar stream connected")

    def node_disconnected(self, node_id: str) -> None:
        self.connected.discard(node_id)
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.READY:
            transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.wall(), reason="sidecar stream closed")
            self._touch(f"node/{node_id}", node)

    def heartbeat(self, node_id: str, active_epochs: Iterable[int]) -> None:
        """A sidecar heartbeat renews the lease holding its node if the node runs that epoch.

        A node that went LOST because its heartbeats lapsed (stream still open) is READY again.
        """
        node = self.node(node_id)
        node.heard_at = self.clock()
        if node.state is NodeState.LOST and node_id in self.connected:
            self._ready_again(node_id, "heartbeats resumed")
        job = self.holder.get(node_id)
        if job is not None:
            permit = self.permits[job]
            if permit.epoch in set(active_epochs):
                permit.expires_at = self.clock() + self.config.lease_ttl_s

    def _ready_again(self, node_id: str, reason: str) -> None:
        node = self.nodes[node_id]
        transition(node, NODE_TRANSITIONS, NodeState.READY, now=self.wall(), reason=reason)
        self._touch(f"node/{node_id}", node)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
        self._pump([node_id])
        self.try_admit()  # pending jobs may fit now

    def drain_node(self, node_id: str) -> NodeState:
        """Stop granting on a node and placing jobs on it; the running permit finishes."""
        node = self.node(node_id)
        if node.state in (NodeState.DRAINING, NodeState.DRAINED):
            return node.state
        transition(node, NODE_TRANSITIONS, NodeState.DRAINING, now=self.wall(), reason="operator drain")
        if node_id not in self.holder:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.wall(), reason="idle")
        self._touch(f"node/{node_id}", node)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
        return node.state


    def heartbeat_changes_state(self, node_id: str) -> bool:
        """Whether a heartbeat from `node_id` would change stored state (its node is LOST)."""
        node = self.nodes.get(node_id)
        return node is not None and node.state is NodeState.LOST

    def _lapsed_nodes(self, now: float) -> list[NodeRecord]:
        lapse = self.config.heartbeat_lapse_s
        return [node for n in self.connected if (node := self.nodes.get(n)) is not None
                and node.state is NodeState.READY and node.heard_at + lapse <= now]
