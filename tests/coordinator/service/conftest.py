"""Fixtures: coordinators (embedded or on the real redis-server of tests/conftest.py) in a thread, builders."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import JobSpec, Pool
from rollmux.core.ports import free_port  # noqa: F401 - likewise
from rollmux.testing.chaos.procs import RedisProcess  # noqa: F401 - the tests here import it from here
from rollmux.wire.client import CoordinatorClient, NodeSession

FAST = ServiceConfig(lease_ttl_s=2.0, reap_interval_s=0.02, heartbeat_interval_s=0.2)


def job_spec(name: str, *, nr: int = 8, nt: int = 8, t_roll_s: float = 100.0, t_train_s: float = 100.0,
             slo: float = 2.0) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=nr, n_train_gpus=nt, t_roll_s=t_roll_s, t_train_s=t_train_s, slo=slo,
                   rollout_state_bytes=10**9, train_state_bytes=10**9)


def node_state(client: CoordinatorClient, node_id: str) -> str:
    return next((n.state for n in client.cluster_state().nodes if n.node_id == node_id), "")


_SESSIONS: list[NodeSession] = []  # node streams opened by add_nodes, closed after each test


def add_node(client: CoordinatorClient, node_id: str, pool: Pool, *, host_dram_bytes: int = 2 * 10**12,
             token: str | None = None) -> NodeSession:
    """Register a node and open its stream, as its sidecar would (a node is READY only with one)."""
    session = NodeSession(client, node_id, pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800", gpu_count=8,
                          host_dram_bytes=host_dram_bytes, token=token, heartbeat_s=0.2).start()
    _SESSIONS.append(session)
    assert session.connected.wait(10), f"node {node_id} stream did not connect"
    deadline = time.monotonic() + 10
    while node_state(client, node_id) != "ready":
        assert time.monotonic() < deadline, f"node {node_id} did not turn ready"
        time.sleep(0.02)
    return session


def add_nodes(client: CoordinatorClient, n_rollout: int, n_train: int, prefix: str = "",
              token_for: Callable[[str], str] | None = None) -> None:
    for i in range(n_rollout):
        add_node(client, f"{prefix}r{i}", Pool.ROLLOUT, token=token_for(f"{prefix}r{i}") if token_for else None)
    for i in range(n_train):
        add_node(client, f"{prefix}t{i}", Pool.TRAIN, token=token_for(f"{prefix}t{i}") if token_for else None)


def close_node_streams() -> None:
    """Close the streams add_nodes opened (before their coordinator stops, or they retry to reach it)."""
    while _SESSIONS:
        _SESSIONS.pop().stop()


@pytest.fixture(autouse=True)
def _close_node_streams() -> Iterator[None]:
    yield
    close_node_streams()


@pytest.fixture(params=["embedded", "redis"])
def coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadedServer]:
    """A coordinator on the embedded store and on a real Redis (each test runs on both)."""
    url = None
    if request.param == "redis":
        r = request.getfixturevalue("redis_server")
        url = r.url
    srv = ThreadedServer(ServerOptions(redis_url=url, config=FAST, http="127.0.0.1:0"))
    assert srv.wait_ready(10), srv.core.not_ready_reason
    yield srv
    close_node_streams()
    srv.stop()


@pytest.fixture
def client(coordinator: ThreadedServer) -> Iterator[CoordinatorClient]:
    c = CoordinatorClient(coordinator.address, retry_s=5.0)
    yield c
    c.close()
