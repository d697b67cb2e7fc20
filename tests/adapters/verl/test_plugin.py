"""The `verl.plugins` entry point fails loudly when opted in (fresh interpreters, no veRL needed)."""

from __future__ import annotations

import os
import subprocess
import sys

from rollmux.sidecar.env import SIDECAR_SOCKET

PROBE = ("import sys; from importlib.metadata import entry_points; "
         "ep = [e for e in entry_points(group='verl.plugins') if e.name == 'rollmux'][0]; "
         "ep.load()(); print('grpc' in sys.modules)")


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SIDECAR_SOCKET} | env_extra
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_unset_does_nothing_and_imports_no_grpc() -> None:
    done = _run({})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_opted_in_refuses_to_run_unscheduled() -> None:
    done = _run({SIDECAR_SOCKET: "/run/rollmux/sidecar.sock"})
    assert done.returncode != 0
    assert "VerlAdapterUnavailableError" in done.stderr and SIDECAR_SOCKET in done.stderr
