"""The ROLL adapter's loading in fresh ``.venv-roll`` interpreters: inert unless opted in, idempotent,
reversible, version-guarded, and failing fast (naming the socket) when no sidecar answers."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from .testbed import ROLL_PY, roll_unavailable

_reason = roll_unavailable()
if _reason:
    print(f"ROLL adapter import tests skipped: {_reason}")
pytestmark = pytest.mark.skipif(_reason is not None, reason=str(_reason))


def _run(code: str, tmp_path: Path, *, socket: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if socket is not None:
        env["ROLLMUX_SIDECAR_SOCKET"] = socket
    proc = subprocess.run([str(ROLL_PY), "-c", "def out(*a): print('RMX:', *a)\n" + textwrap.dedent(code)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # ROLL logs to stdout: keep only our lines
    proc.stdout = "\n".join(line[5:] for line in proc.stdout.splitlines() if line.startswith("RMX: "))
    return proc


def test_unset_variable_loads_nothing_of_rollmux(tmp_path: Path) -> None:
    proc = _run("""
        import sys
        import roll.pipeline.rlvr.rlvr_pipeline as m
        out(sorted(n for n in sys.modules if n.startswith("rollmux")))
        out(getattr(m.RLVRPipeline.run, "__rollmux_patch__", None))
    """, tmp_path, socket=None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["[]", "None"]


def test_opted_in_patches_lazily_idempotently_and_unpatch_restores(tmp_path: Path) -> None:
    proc = _run("""
        import roll.pipeline.rlvr.rlvr_pipeline as m
        import rollmux.adapters.roll as a
        from rollmux.adapters.common.patching import MARKER
        out(getattr(m.RLVRPipeline.run, MARKER, None), len(a.applied()))
        out(a.patch())                      # already installed by the .pth hook: no-op
        a.unpatch()
        out(a.applied(), getattr(m.RLVRPipeline.run, MARKER, None), m.get_tracer.__module__)
    """, tmp_path, socket=str(tmp_path / "none.sock"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, again, after = proc.stdout.split("\n")[:3]
    assert first.split()[0] == "roll" and int(first.split()[1]) >= 5
    assert again == "False"
    assert after == "() None roll.utils.telemetry"


def test_unsupported_roll_version_stops_the_import(tmp_path: Path) -> None:
    proc = _run("""
        import importlib.metadata as md
        real = md.version
        md.version = lambda name: "0.4.0" if name == "roll" else real(name)
        try:
            import roll
        except Exception as exc:
            out(type(exc).__name__, exc)
    """, tmp_path, socket=str(tmp_path / "none.sock"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("AdapterError") and "roll==0.3.0" in proc.stdout and "found 0.4.0" in proc.stdout


def test_opted_in_without_sidecar_fails_before_ray_starts_naming_the_socket(tmp_path: Path) -> None:
    sock = str(tmp_path / "missing.sock")
    proc = _run("""
        import ray
        from roll.distributed.scheduler.initialize import init
        try:
            init()
        except Exception as exc:
            out(type(exc).__name__, exc)
        out("ray started:", ray.is_initialized())
    """, tmp_path, socket=sock)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("AdapterError") and sock in proc.stdout
    assert "ray started: False" in proc.stdout
