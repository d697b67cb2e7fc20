"""`rollmux sidecar` as a real process against a coordinator with a bootstrap secret: it derives its
node token from --secret-file (or the variables), shows the coordinator's real refusal, and exits
promptly on SIGTERM, also while it is still trying to connect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.wire import auth
from rollmux.wire import env as coord_env
from rollmux.wire.client import CoordinatorClient

from .conftest import REPO, free_port

SECRET = "cli-test-secret"


@pytest.fixture
def secured() -> Iterator[ThreadedServer]:
    srv = ThreadedServer(ServerOptions(listen="127.0.0.1:0", http=None, secret=SECRET))
    assert srv.wait_ready(30)
    yield srv
    srv.stop()


def sidecar(address: str, sockdir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.Popen([sys.executable, "-m", "rollmux", "sidecar", "--coordinator", address, "--node-id", "r0",
                             "--pool", "rollout", "--no-nvml", "--socket", str(sockdir / "s.sock"),
                             "--ready-file", str(sockdir / "ready"), *extra], cwd=REPO, env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_file(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def stop_timed(proc: subprocess.Popen[str]) -> float:
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return time.monotonic() - t


@pytest.mark.parametrize("how", ["flag", "file-variable", "secret-variable"])
def test_joins_a_secured_coordinator_with_the_secret(secured, sockdir: Path, how: str) -> None:
    secret_file = sockdir / "secret"
    secret_file.write_text(SECRET + "\n")
    extra, env = {"flag": (["--secret-file", str(secret_file)], {}),
                  "file-variable": ([], {coord_env.SECRET_FILE: str(secret_file)}),
                  "secret-variable": ([], {coord_env.BOOTSTRAP_SECRET: SECRET})}[how]
    proc = sidecar(secured.address, sockdir, *extra, env=env)
    try:
        wait_file(sockdir / "ready", proc)
        nodes = CoordinatorClient(secured.address, token=auth.operator_token(SECRET)).cluster_state().nodes
        assert [(n.node_id, n.connected) for n in nodes] == [("r0", True)]
    finally:
        took = stop_timed(proc)
    assert proc.returncode == 0 and took < 5.0, (took, proc.stderr.read() if proc.stderr else "")
    assert SECRET not in (proc.stderr.read() if proc.stderr else "")


@pytest.mark.parametrize("secret,code", [(None, "UNAUTHENTICATED"), ("not-the-secret", "PERMISSION_DENIED")])
def test_a_refused_node_credential_is_reported_and_ends_the_sidecar(secured, sockdir: Path, secret, code) -> None:
    env = {coord_env.BOOTSTRAP_SECRET: secret} if secret else {}
    t = time.monotonic()
    proc = sidecar(secured.address, sockdir, env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert time.monotonic() - t < 30
    assert f"refused node r0: {code}" in err and "--secret-file" in err
    assert "cannot reach" not in err


def test_sigterm_while_the_coordinator_is_unreachable_exits_promptly(sockdir: Path) -> None:
    proc = sidecar(f"127.0.0.1:{free_port()}", sockdir)
    time.sleep(3.0)  # well into the first connection attempts
    assert proc.poll() is None
    took = stop_timed(proc)
    assert proc.returncode == 0 and took < 5.0, took


def test_unreachable_coordinator_is_reported_with_the_last_error(sockdir: Path) -> None:
    proc = sidecar(f"127.0.0.1:{free_port()}", sockdir, "--connect-wait-s", "1")
    try:
        time.sleep(4.0)
    finally:
        stop_timed(proc)
    err = proc.stderr.read() if proc.stderr else ""
    assert "cannot reach the coordinator" in err and "UNAVAILABLE" in err, err


def test_empty_secret_file_is_refused_at_start(sockdir: Path) -> None:
    (sockdir / "empty").write_text("\n")
    proc = sidecar("127.0.0.1:1", sockdir, "--secret-file", str(sockdir / "empty"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "is empty" in err
