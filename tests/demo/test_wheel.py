"""The demo as a user gets it from a wheel: build the wheel, install it into a fresh virtualenv and run
a short ``rollmux demo`` from an unrelated directory with a relative ``--out``.

The fresh venv gets the wheel alone (``--no-deps``); its dependencies (torch, grpc, rich, matplotlib,
...) come from this test's environment through a ``.pth`` line added *after* the install, so nothing
is downloaded and the venv's own copy of rollmux, from the wheel, comes first on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCES = {".venv", ".git", "build", "dist", "out", "rollmux-demo", "__pycache__", ".pytest_cache",
               ".ruff_cache", ".mypy_cache", ".hypothesis"}


def _sources(tmp: Path) -> Path:
    """A copy of the source tree, so the build writes nothing into the checkout."""
    def ignore(_: str, names: list[str]) -> set[str]:
        return {n for n in names if n in NOT_SOURCES or n.endswith(".egg-info")}

    return Path(shutil.copytree(ROOT, tmp / "src", ignore=ignore))


def _run(argv: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ROLLMUX_")}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_from_a_wheel_in_a_fresh_venv_from_any_directory(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
          str(_sources(tmp_path))], cwd=tmp_path, timeout=180)
    (wheel,) = wheels.glob("rollmux-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, timeout=60)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
         cwd=tmp_path, timeout=120)
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp_path, timeout=30).stdout.strip())
    (purelib / "deps-from-the-test-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = _run([str(py), "-c", "import rollmux.demo.tiny_grpo.job, rollmux; print(rollmux.__file__)"],
                 cwd=tmp_path, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(venv), f"rollmux came from {where}, not from the wheel"

    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    proc = _run([str(venv / "bin" / "rollmux"), "demo", "--no-live", "--out", "out", "--seconds", "6",
                 "--solo-iterations", "2"], cwd=elsewhere, timeout=300)
    summary = json.loads((elsewhere / "out" / "summary.json").read_text())
    assert summary["overlapping_phases"] == 0 and summary["order_violations"] == 0, summary
    assert summary["throughput_per_core_ratio"] > 0, summary
    assert (elsewhere / "out" / "gantt.png").stat().st_size > 10_000
    assert "Gantt chart:" in proc.stdout
