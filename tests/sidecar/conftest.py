"""Fixtures: an embedded coordinator in a thread, node agents serving on short Unix sockets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import ClusterSpec, JobSpec, Pool
from rollmux.core.ports import free_port  # noqa: F401 - the tests here import it from here
from rollmux.sidecar.agent import AgentConfig, NodeAgent
from rollmux.sidecar.gpu import GpuProvider, NoGpuProvider
from rollmux.sidecar.server import serve
from rollmux.wire.client import CoordinatorClient

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def coordinator(request: pytest.FixtureRequest) -> Iterator[ThreadedServer]:
    """An embedded coordinator; ``@pytest.mark.parametrize("coordinator", ["redis"], indirect=True)``
    puts its state in a real redis-server instead."""
    url = request.getfixturevalue("redis_server").url if getattr(request, "param", "") == "redis" else None
    srv = ThreadedServer(ServerOptions(listen="127.0.0.1:0", http=None, redis_url=url,
                                       cluster=ClusterSpec(gpus_per_node=1),
                                       config=ServiceConfig(lease_ttl_s=5.0, reap_interval_s=0.05,
                                                            heartbeat_interval_s=0.2)))
    assert srv.wait_ready(30)
    yield srv
    srv.stop()


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rmxt-"))  # short: sun_path is 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Node:
    def __init__(self, agent: NodeAgent, server: object, socket: str) -> None:
        self.agent, self.server, self.socket = agent, server, socket


@pytest.fixture
def make_node(coordinator: ThreadedServer, sockdir: Path) -> Iterator:
    nodes: list[Node] = []

    def make(node_id: str, pool: Pool, *, gpu: GpuProvider | None = None, memory_wait_s: float = 30.0) -> Node:
        agent = NodeAgent(AgentConfig(node_id=node_id, pool=pool, heartbeat_s=0.2, memory_wait_s=memory_wait_s),
                          CoordinatorClient(coordinator.address, retry_s=5.0),
                          gpu or NoGpuProvider("H20" if pool is Pool.ROLLOUT else "H800", 1)).start()
        assert agent.wait_connected(30)
        path = str(sockdir / f"{node_id}.sock")
        node = Node(agent, serve(agent, path), path)
        nodes.append(node)
        return node

    yield make
    for n in nodes:
        n.server.stop(0)  # type: ignore[attr-defined]
        n.agent.stop()


def register(coordinator: ThreadedServer, name: str) -> str:
    spec = JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)
    return str(CoordinatorClient(coordinator.address).register_job(spec).token)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60,
               args: list[str] | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e["PYTHONPATH"] = str(REPO)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *(args or [])], cwd=REPO, env=e, capture_output=True, text=True,
                          timeout=timeout)
