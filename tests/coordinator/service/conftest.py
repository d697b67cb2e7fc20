"""Fixtures: a real redis-server on a free port, coordinators (embedded or Redis) in a thread, builders."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.api import ServiceConfig
from rollmux.coordinator.service.client import CoordinatorClient
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


def add_nodes(client: CoordinatorClient, n_rollout: int, n_train: int, prefix: str = "") -> None:
    for i in range(n_rollout):
        client.register_node(f"{prefix}r{i}", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12)
    for i in range(n_train):
        client.register_node(f"{prefix}t{i}", Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * 10**12)


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
    srv.stop()


@pytest.fixture
def client(coordinator: ThreadedServer) -> Iterator[CoordinatorClient]:
    c = CoordinatorClient(coordinator.address, retry_s=5.0)
    yield c
    c.close()
