"""The sidecar survives a coordinator restart: its connection goes RECONNECTING, then CONNECTED again,
and the node is registered at the new coordinator without restarting the sidecar."""

from __future__ import annotations

import time

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import ClusterSpec, Pool
from rollmux.sidecar.agent import AgentConfig, NodeAgent
from rollmux.sidecar.api import ConnectionState
from rollmux.sidecar.gpu import NoGpuProvider
from rollmux.wire.client import CoordinatorClient

from .conftest import free_port


def start(port: int) -> ThreadedServer:
    srv = ThreadedServer(ServerOptions(listen=f"127.0.0.1:{port}", http=None, cluster=ClusterSpec(gpus_per_node=1),
                                       config=ServiceConfig(heartbeat_interval_s=0.2)))
    assert srv.wait_ready(30)
    return srv


def wait_state(agent: NodeAgent, state: ConnectionState, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while agent.connection.state is not state:
        assert time.monotonic() < deadline, f"connection stayed {agent.connection.state.value}, wanted {state.value}"
        time.sleep(0.05)


def test_reconnects_and_reregisters_after_coordinator_restart() -> None:
    port = free_port()
    srv = start(port)
    agent = NodeAgent(AgentConfig(node_id="r0", pool=Pool.ROLLOUT, heartbeat_s=0.2),
                      CoordinatorClient(f"127.0.0.1:{port}", retry_s=2.0), NoGpuProvider("H20", 1)).start()
    try:
        wait_state(agent, ConnectionState.CONNECTED)
        srv.stop()
        wait_state(agent, ConnectionState.RECONNECTING)
        srv = start(port)  # a fresh coordinator (embedded store: it knows nothing)
        wait_state(agent, ConnectionState.CONNECTED)
        nodes = [n.node_id for n in CoordinatorClient(f"127.0.0.1:{port}").cluster_state().nodes]
        assert nodes == ["r0"]
        assert agent.connection.reconnects == 1
    finally:
        agent.stop()
        srv.stop()
