"""Restartable real processes of a local deployment: redis-server, coordinators and node sidecars.

Each keeps its port (or socket) across restarts, so clients reconnect to the same address, and
appends its output to a log file per start in its work folder.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rollmux.core.errors import RollMuxError
from rollmux.core.ports import free_port

REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"


class ProcessStartError(RollMuxError):
    """A child process did not come up in time (its log file is named in the message)."""


def wait_port(port: int, timeout_s: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None,
              what: str = "the process") -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:`port` (fail early if `proc` exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ProcessStartError(f"{what} exited with {proc.returncode} while starting")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ProcessStartError(f"{what} did not listen on port {port} within {timeout_s:g}s")


class _Child:
    """One restartable child: `argv()` is its command line; SIGKILL or SIGTERM it, start it again."""

    name = "child"

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}-{self.starts}.log"

    def spawn(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (no cleanup: what a crash or an OOM kill does)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None


class RedisProcess(_Child):
    """A redis-server with an append-only file, restartable on the same port and data dir."""

    name = "redis"

    def __init__(self, workdir: Path, *, fsync: str = "everysec") -> None:
        super().__init__(workdir)
        self.port, self.fsync = free_port(), fsync

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        return [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "", "--protected-mode", "no"]

    def start(self) -> None:
        if not Path(REDIS_BIN).exists():
            raise ProcessStartError(f"redis-server not found at {REDIS_BIN}: install redis (setup.sh --dev does)")
        proc = self.spawn()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise ProcessStartError(f"redis-server did not start on port {self.port}; see {self.log}")

    def stop(self, grace_s: float = 10.0) -> None:
        """Clean shutdown (SIGTERM flushes the append-only file)."""
        super().stop(grace_s)


class CoordinatorProcess(_Child):
    """``rollmux coordinator`` on a Redis; instances with different ids form a leader and standbys.

    Args:
        redis_url: the shared Redis.
        workdir: folder of its logs.
        instance_id: leadership owner name (a restart with the same id takes over at once).
        extra: further flags (``--lease-ttl 2``, ``--secret-file F``, ...).
    """

    def __init__(self, redis_url: str, workdir: Path, *, instance_id: str = "chaos",
                 extra: Sequence[str] = ()) -> None:
        super().__init__(workdir)
        self.name = f"coordinator-{instance_id}"
        self.url, self.instance_id, self.extra = redis_url, instance_id, list(extra)
        self.port = free_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "rollmux", "coordinator", "--redis", self.url, "--listen", self.address,
                "--http", "", "--instance-id", self.instance_id, "--log-format", "text", *self.extra]

    def start(self, timeout_s: float = 60.0, *, wait: bool = True) -> None:
        """Start it and (with `wait`) wait until its gRPC port accepts (a standby accepts before it leads)."""
        self.spawn()
        if wait:
            self.wait_listening(timeout_s)

    def wait_listening(self, timeout_s: float = 60.0) -> None:
        what = f"coordinator {self.instance_id} (log {self.log})"
        wait_port(self.port, timeout_s, proc=self.proc, what=what)
        time.sleep(0.2)  # the port answers: make sure it is ours (a failed bind exits at once)
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"{what} exited with {self.proc.returncode} while starting")

    def leading(self, token: str | None = None) -> bool:
        """True when it answers and reports itself ready (it holds the leadership and its state)."""
        from rollmux.wire.client import CoordinatorClient
        from rollmux.wire.errors import ServiceError

        if not self.alive():
            return False
        client = CoordinatorClient(self.address, token=token, retry_s=0.5)
        try:
            return bool(client.cluster_state().ready)
        except ServiceError:
            return False
        finally:
            client.close()


class SidecarProcess(_Child):
    """``rollmux sidecar`` of one node, serving its ranks on `socket_path`.

    Args:
        coordinators: ``host:port[,host:port]`` (leader, then standbys).
        node_id: the node's id; pool: ``rollout`` or ``train``.
        socket_path: the Unix socket (kept across restarts: ranks find the restarted sidecar there).
        extra: further flags (``--secret-file F``, ``--heartbeat-s 0.2``, ...).
    """

    def __init__(self, coordinators: str, workdir: Path, *, node_id: str, pool: str, socket_path: str,
                 extra: Sequence[str] = ()) -> None:
        super().__init__(workdir)
        self.name = f"sidecar-{node_id}"
        self.coordinators, self.node_id, self.pool, self.socket = coordinators, node_id, pool, socket_path
        self.extra = list(extra)
        self.ready_file = workdir / f"{self.name}.ready"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "rollmux", "sidecar", "--coordinator", self.coordinators, "--node-id",
                self.node_id, "--pool", self.pool, "--socket", self.socket, "--no-nvml", "--ready-file",
                str(self.ready_file), *self.extra]

    def start(self, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        self.ready_file.unlink(missing_ok=True)
        self.spawn()
        if wait:
            self.wait_ready(timeout_s)

    def ready(self) -> bool:
        """Running, connected to the coordinator and serving its socket."""
        return self.alive() and self.ready_file.exists()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.alive() or time.monotonic() > deadline:
                raise ProcessStartError(f"sidecar {self.node_id} did not come up; see {self.log}")
            time.sleep(0.05)

    def kill(self) -> None:
        super().kill()
        self.ready_file.unlink(missing_ok=True)
