"""The demo as a user gets it from a wheel: build the wheel, install it into a fresh virtualenv and run
a short ``rollmux demo`` from an unrelated directory with a relative ``--out``.

The fresh venv gets the wheel alone (``--no-deps``, nothing is downloaded); its dependencies come from
this test's environment, but only the ones ``pip install rollmux torch`` would bring: the wheel's own
``Requires-Dist`` without extras, plus torch (the demo's jobs train a model), resolved to their
transitive closure and linked into one folder that a ``.pth`` line adds. The ``plots`` extra
(matplotlib) is not among them, so the tour must finish without it: exit 0, the full summary, and a
one-line hint in place of the Gantt picture.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rollmux.demo.report import PLOTS_HINT

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCES = {".venv", ".venv-roll", ".git", "build", "dist", "out", "rollmux-demo", "__pycache__",
               ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
DEMO_NEEDS = ("torch",)  # what a user adds to run the tour: `pip install rollmux torch`


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


def _base_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` lines that apply without any extra."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(reqs: list[Requirement]) -> dict[str, md.Distribution]:
    """Installed distributions reached from `reqs` (no extras), as pip would resolve them."""
    found: dict[str, md.Distribution] = {}
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        found[name] = md.distribution(req.name)
        todo += [Requirement(r) for r in found[name].requires or []]
    return found


def _link_deps(dists: dict[str, md.Distribution], into: Path) -> None:
    """One folder holding (links to) exactly these distributions' top-level files."""
    into.mkdir()
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(str(dist.locate_file(top))))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_from_a_wheel_without_extras_in_a_fresh_venv_from_any_directory(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
          str(_sources(tmp_path))], cwd=tmp_path, timeout=180)
    (wheel,) = wheels.glob("rollmux-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, timeout=60)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
         cwd=tmp_path, timeout=120)
    deps = _closure(_base_requirements(wheel) + [Requirement(n) for n in DEMO_NEEDS])
    assert "matplotlib" not in deps, "matplotlib became a base dependency: this test no longer tests the hint"
    _link_deps(deps, tmp_path / "deps")
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp_path, timeout=30).stdout.strip())
    (purelib / "deps.pth").write_text(f"{tmp_path / 'deps'}\n")
    probe = _run([str(py), "-c", "import importlib.util as u, rollmux; "
                  "print(rollmux.__file__); print(u.find_spec('matplotlib') is None)"], cwd=tmp_path, timeout=60)
    where, no_matplotlib = probe.stdout.split()
    assert Path(where).is_relative_to(venv), f"rollmux came from {where}, not from the wheel"
    assert no_matplotlib == "True", "the fresh venv can import matplotlib: the extra leaked in"

    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    proc = _run([str(venv / "bin" / "rollmux"), "demo", "--no-live", "--out", "out", "--seconds", "6",
                 "--solo-iterations", "2"], cwd=elsewhere, timeout=300)
    summary = json.loads((elsewhere / "out" / "summary.json").read_text())
    assert summary["overlapping_phases"] == 0 and summary["order_violations"] == 0, summary
    assert summary["throughput_per_core_ratio"] > 0, summary
    assert not (elsewhere / "out" / "gantt.png").exists()
    said = " ".join(proc.stdout.split())  # rich wraps long lines at its console width
    assert f"Gantt chart: {PLOTS_HINT}" in said, proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
