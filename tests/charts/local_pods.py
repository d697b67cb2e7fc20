"""The chart's containers run as local processes: the rendered args, with in-pod paths and addresses
swapped for local ones (the Secret and ConfigMap contents written as files), nothing else changed."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollmux.core.ports import free_port

from .conftest import ROOT, Rendered, container, name

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def localize(args: list[str], overrides: dict[str, str], files: dict[str, Path]) -> list[str]:
    """`--flag=value` args with `overrides[flag]` as the value, and in-pod file paths mapped to `files`."""
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if eq:
            value = overrides.get(flag, str(files.get(value, value)))
            out.append(f"{flag}={value}")
        else:
            out.append(arg)
    return out


@contextmanager
def chart_redis(r: Rendered, workdir: Path) -> Iterator[int]:
    """A redis-server with the chart's generated password and AOF on; yields its port."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found (bash scripts/setup.sh --dev installs it)")
    password = r.secret_value(name("redis"), "redis-password")
    port = free_port()
    (workdir / "redis.conf").write_text(f"requirepass {password}\n")
    proc = subprocess.Popen([binary, str(workdir / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(workdir), "--appendonly", "yes", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pong() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
                return b"+PONG" in s.recv(64)
        except OSError:
            return False

    try:
        wait_until(pong, 10, "redis-server")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True)
class Coordinator:
    grpc: int
    http: int
    secret: str
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def readyz(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=5).status == 200
        except OSError:  # 503 until leadership is held and the state loaded
            return False


def secret_files(r: Rendered, workdir: Path) -> dict[str, Path]:
    """The auth Secret and catalog ConfigMap as local files, by their in-pod path."""
    files = {"/etc/rollmux/auth/bootstrap-secret": r.secret_value(name("auth"), "bootstrap-secret"),
             "/etc/rollmux/catalog/gpus.yaml": r.one("ConfigMap", name("catalog"))["data"]["gpus.yaml"]}
    local = {}
    for path, text in files.items():
        local[path] = workdir / Path(path).name
        local[path].write_text(text)
    return local


@contextmanager
def chart_coordinator(r: Rendered, workdir: Path, **overrides: str) -> Iterator[Coordinator]:
    """The rendered coordinator container on a chart-configured redis-server, until ready."""
    with chart_redis(r, workdir) as redis_port:
        c = container(r.one("Deployment", name("coordinator")), "coordinator")
        local = {"--listen": "127.0.0.1:0", "--http": "127.0.0.1:0", "--instance-id": "rm-rollmux-coordinator-0",
                 "--log-format": "text", **overrides}
        args = localize(c["args"], local, secret_files(r, workdir))
        env = {e["name"]: e.get("value", "") for e in c["env"]}
        url = env["ROLLMUX_REDIS_URL"].replace("$(REDIS_PASSWORD)", r.secret_value(name("redis"), "redis-password"))
        url = re.sub(r"@[^/]+/", f"@127.0.0.1:{redis_port}/", url)
        ports, log = workdir / "ports.json", workdir / "coordinator.log"
        proc = subprocess.Popen([sys.executable, "-m", "rollmux", *args, "--port-file", str(ports)], cwd=ROOT,
                                env={**CLEAN_ENV, "ROLLMUX_REDIS_URL": url}, stdout=subprocess.DEVNULL,
                                stderr=log.open("wb"))
        try:
            wait_until(lambda: ports.exists() or proc.poll() is not None, 30, "the coordinator to listen")
            assert proc.poll() is None, f"the coordinator exited {proc.returncode}:\n{log.read_text()}"
            bound = json.loads(ports.read_text())
            coordinator = Coordinator(grpc=bound["grpc"], http=bound["http"],
                                      secret=r.secret_value(name("auth"), "bootstrap-secret"), log=log)
            wait_until(coordinator.readyz, 30, "/readyz")
            yield coordinator
        finally:
            proc.terminate()
            proc.wait(15)


@contextmanager
def chart_sidecar(r: Rendered, pool: str, node: str, coordinator: Coordinator, workdir: Path) -> Iterator[Path]:
    """The rendered sidecar container of `pool` as node `node`; yields its socket once connected."""
    c = container(r.one("DaemonSet", name(f"sidecar-{pool}")), "sidecar")
    sock, ready = workdir / f"{node}.sock", workdir / f"{node}.ready"
    args = localize(c["args"], {"--coordinator": coordinator.address, "--socket": str(sock),
                                "--ready-file": str(ready), "--node-id": node}, secret_files(r, workdir))
    log = workdir / f"{node}.log"
    proc = subprocess.Popen([sys.executable, "-m", "rollmux", *args], cwd=ROOT, env=CLEAN_ENV,
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, f"sidecar {node} to connect")
        assert proc.poll() is None, f"sidecar {node} exited {proc.returncode}:\n{log.read_text()}"
        yield sock
    finally:
        proc.terminate()
        proc.wait(15)
