"""Node liveness: registration, sidecar streams, heartbeats, drain.

A node is READY only while its sidecar's stream is open and its heartbeats arrive: a registered node
starts LOST until its stream connects, and turns LOST again when the stream closes or goes silent.
Its GPU type must be one of the coordinator's catalog.

Owns: the node records (`state.nodes`, ``node/<id>``: registration and every node transition) and
`connected`. Calls nothing: a node that became READY again is reported to the caller
(`connect`, `heard` return True), which grants on it and admits pending jobs.
"""

from __future__ import annotations

from rollmux.coordinator.service.runtime.api import AlreadyExistsError, InvalidArgumentError, NodeState
from rollmux.coordinator.service.runtime.records import NodeRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.runtime.states import NODE_TRANSITIONS, transition
from rollmux.core.model import Pool


class NodeLiveness:
    """Registering nodes and following whether their sidecars are alive."""

    def __init__(self, state: RuntimeState) -> None:
        self.state = state
        self.connected: set[str] = set()  # nodes with an open sidecar stream (memory only)

    def register_node(self, *, node_id: str, pool: Pool, gpu_type: str, gpu_count: int,
                      host_dram_bytes: int, nvml: dict[str, str]) -> NodeRecord:
        """Register a node, or refresh the facts of a known one (a restarted sidecar).

        Raises:
            InvalidArgumentError: the GPU type is not in the catalog.
            AlreadyExistsError: the id is registered in the other pool.
        """
        state = self.state
        catalog = state.cluster.catalog
        if gpu_type not in catalog:
            raise InvalidArgumentError(f"node {node_id!r} gpu_type={gpu_type!r} is not in the coordinator's GPU "
                                       f"catalog {sorted(catalog.gpus)}: use one of those names, or start the "
                                       "coordinator with --catalog FILE listing it")
        existing = state.nodes.get(node_id)
        if existing is not None:
            if existing.pool is not pool:
                raise AlreadyExistsError(f"node {node_id!r} is registered in pool {existing.pool.value}, "
                                         f"not {pool.value}: give the node another id")
            existing.gpu_type, existing.gpu_count = gpu_type, gpu_count
            existing.host_dram_bytes, existing.nvml = host_dram_bytes, dict(nvml)
            state.touch(f"node/{node_id}", existing)
            return existing
        node = NodeRecord(node_id=node_id, pool=pool, gpu_type=gpu_type, gpu_count=gpu_count,
                          host_dram_bytes=host_dram_bytes, nvml=dict(nvml))
        transition(node, NODE_TRANSITIONS, NodeState.LOST, now=state.wall(),
                   reason="registered; not READY until its sidecar stream connects")
        state.nodes[node_id] = node
        state.touch(f"node/{node_id}", node)
        return node

    def connect(self, node_id: str) -> bool:
        """The node's sidecar stream opened; returns whether the node became READY again."""
        node = self.state.node(node_id)
        self.connected.add(node_id)
        node.heard_at = self.state.clock()
        if not node.streams:
            node.streams = True
            self.state.touch(f"node/{node_id}", node)
        if node.state is NodeState.LOST:
            self._ready_again(node, "sidecar stream connected")
            return True
        return False

    def disconnect(self, node_id: str) -> None:
        self.connected.discard(node_id)
        node = self.state.nodes.get(node_id)
        if node is not None and node.state is NodeState.READY:
            transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.state.wall(), reason="sidecar stream closed")
            self.state.touch(f"node/{node_id}", node)

    def heard(self, node_id: str) -> bool:
        """A heartbeat arrived; returns whether the node became READY again (its heartbeats had
        lapsed while its stream stayed open)."""
        node = self.state.node(node_id)
        node.heard_at = self.state.clock()
        if node.state is NodeState.LOST and node_id in self.connected:
            self._ready_again(node, "heartbeats resumed")
            return True
        return False

    def _ready_again(self, node: NodeRecord, reason: str) -> None:
        transition(node, NODE_TRANSITIONS, NodeState.READY, now=self.state.wall(), reason=reason)
        self.state.touch(f"node/{node.node_id}", node)
        self.state.notify(Notice(kind=NoticeKind.NODE, nodes=(node.node_id,)))

    def drain(self, node_id: str, *, held: bool) -> NodeState:
        """Stop granting on a node and placing jobs on it; the running permit (`held`) finishes."""
        node = self.state.node(node_id)
        if node.state in (NodeState.DRAINING, NodeState.DRAINED):
            return node.state
        transition(node, NODE_TRANSITIONS, NodeState.DRAINING, now=self.state.wall(), reason="operator drain")
        if not held:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.state.wall(), reason="idle")
        self.state.touch(f"node/{node_id}", node)
        self.state.notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
        return node.state

    def permit_ended(self, node_id: str) -> bool:
        """The permit holding `node_id` ended: a draining node is DRAINED now (returns True then)."""
        node = self.state.nodes.get(node_id)
        if node is None or node.state is not NodeState.DRAINING:
            return False
        transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.state.wall(), reason="permit ended")
        self.state.touch(f"node/{node_id}", node)
        return True

    def lapse(self) -> None:
        """Turn LOST every node whose stream is open but whose heartbeats lapsed
        (`ServiceConfig.heartbeat_lapse_s`): nothing new is granted on it."""
        config = self.state.config
        for node in self._lapsed_nodes(self.state.clock()):
            transition(node, NODE_TRANSITIONS, NodeState.LOST, now=self.state.wall(),
                       reason=f"no heartbeat for {config.heartbeat_lapse_s:g}s (stream still open)")
            self.state.touch(f"node/{node.node_id}", node)
            self.state.notify(Notice(kind=NoticeKind.NODE, nodes=(node.node_id,)))

    def _lapsed_nodes(self, now: float) -> list[NodeRecord]:
        lapse = self.state.config.heartbeat_lapse_s
        return [node for n in self.connected if (node := self.state.nodes.get(n)) is not None
                and node.state is NodeState.READY and node.heard_at + lapse <= now]

    def next_lapse(self) -> float | None:
        """When the first connected READY node's heartbeats lapse if none arrives."""
        lapse = self.state.config.heartbeat_lapse_s
        return min((node.heard_at + lapse for n in self.connected if (node := self.state.nodes.get(n)) is not None
                    and node.state is NodeState.READY), default=None)

    def usable(self, node_id: str) -> bool:
        """Ready (which a node is only while its sidecar stream is connected)."""
        node = self.state.nodes.get(node_id)
        return node is not None and node.state is NodeState.READY and node_id in self.connected

    def heartbeat_changes_state(self, node_id: str) -> bool:
        """Whether a heartbeat from `node_id` would change stored state (its node is LOST)."""
        node = self.state.nodes.get(node_id)
        return node is not None and node.state is NodeState.LOST

    def restore(self, nodes: dict[str, NodeRecord]) -> None:
        """Load stored node records after a coordinator restart: every READY node starts LOST until its
        sidecar reconnects; the policy's snapshot gets every node (before its groups are restored)."""
        state = self.state
        state.nodes.update(nodes)
        for node in state.nodes.values():
            if node.state is NodeState.READY:
                transition(node, NODE_TRANSITIONS, NodeState.LOST, now=state.wall(), reason="coordinator restarted")
                state.touch(f"node/{node.node_id}", node)
        for node in state.nodes.values():
            state.placement.set_node(node.node_id, host_dram_bytes=node.host_dram_bytes,
                                     available=node.state is NodeState.READY)
