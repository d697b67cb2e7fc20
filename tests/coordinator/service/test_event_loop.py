"""The coordinator's event loop: uvloop by default where installed, asyncio by choice or as the fallback,
and the same service on either (the real `rollmux coordinator` process and the in-thread server)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollmux.coordinator.service.event_loop import EventLoop, EventLoopUnavailable, resolve, uvloop_installed
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.wire.client import CoordinatorClient

from .conftest import FAST


def loop_kind(srv: ThreadedServer) -> str:
    return str(srv.run(lambda: type(asyncio.get_running_loop()).__module__.split(".")[0]))


def assert_serves(address: str) -> None:
    client = CoordinatorClient(address)
    try:
        assert list(client.cluster_state().nodes) == []
    finally:
        client.close()


def test_uvloop_is_installed_with_rollmux() -> None:
    # a dependency of the package on Linux and macOS, so `auto` means uvloop for every user there
    assert uvloop_installed()
    assert resolve("auto") is EventLoop.UVLOOP


def test_without_uvloop_auto_falls_back_and_a_named_uvloop_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a platform without it
    assert resolve("auto") is EventLoop.ASYNCIO
    with pytest.raises(EventLoopUnavailable, match="uvloop is not installed"):
        resolve("uvloop")
    from rollmux.cli import main

    assert main(["coordinator", "--embedded", "--event-loop", "uvloop"]) == 2
    assert "--event loop uvloop: uvloop is not installed" in capsys.readouterr().err


@pytest.mark.parametrize("choice, expected", [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_in_thread_server_runs_on_the_chosen_loop_and_serves(choice: str, expected: str) -> None:
    srv = ThreadedServer(ServerOptions(config=FAST, http=None, event_loop=choice))
    try:
        assert loop_kind(srv) == expected
        assert_serves(srv.address)
    finally:
        srv.stop()


@pytest.mark.parametrize("flags, expected", [([], "uvloop"), (["--event-loop", "asyncio"], "asyncio")])
def test_coordinator_process_reports_its_loop_and_stops_cleanly(tmp_path: Path, flags: list[str],
                                                                expected: str) -> None:
    ports = tmp_path / "ports.json"
    proc = subprocess.Popen([sys.executable, "-m", "rollmux", "coordinator", "--embedded", "--listen",
                             "127.0.0.1:0", "--http", "", "--port-file", str(ports), "--log-format", "json", *flags],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ports.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the coordinator did not write its port file"
            time.sleep(0.05)
        assert_serves(f"127.0.0.1:{json.loads(ports.read_text())['grpc']}")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    listening = [json.loads(line) for line in err.splitlines() if '"coordinator listening"' in line]
    assert [r["event_loop"] for r in listening] == [expected], err

