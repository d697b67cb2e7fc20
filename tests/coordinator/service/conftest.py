"""Fixtures: a real redis-server on a free port, coordinators (embedded or Redis) in a thread, builders."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.api import ServiceConfig
from rollmux.coordinator.service.client import CoordinatorClient, NodeSession
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.model import JobSpec, Pool

REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    """A redis-server with an append-only file, restartable on the same port and data dir."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """Clean shutdown (SIGTERM flushes the append-only file)."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class CoordinatorProcess:
    """`rollmux coordinator --redis` in its own process, SIGKILLed and restarted with one instance id."""

    def __init__(self, redis_url: str, workdir: Path, *flags: str, instance_id: str = "chaos") -> None:
        self.port, self.url, self.dir, self.flags, self.instance_id = free_port(), redis_url, workdir, flags, instance_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        err = open(self.dir / f"coordinator-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollmux", "coordinator", "--redis", self.url, "--listen", self.address,
             "--http", "", "--lease-ttl", "2.0", "--instance-id", self.instance_id, "--log-format", "text",
             *self.flags], stderr=err, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("coordinator did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    if not Path(REDIS_BIN).exists():
        pytest.skip(f"redis-server not found at {REDIS_BIN}: install redis to run the Redis tests")
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()


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
