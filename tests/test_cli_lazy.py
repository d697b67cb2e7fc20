"""``rollmux COMMAND`` imports that command's module alone, so a node without the simulator's or the
demo's dependencies (a bare GPU machine) still runs ``rollmux sidecar``."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollmux.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def absent(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing each of `modules` fails as if it were not installed."""
    for m in modules:
        d = tmp_path / "absent" / m
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{m}'\", name={m!r})\n")
    path = os.pathsep.join([str(tmp_path / "absent"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _rollmux(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from rollmux.cli import main; sys.exit(main())", *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd="/")


def test_listed_help_is_each_modules_help() -> None:
    for name, (module, help_text) in COMMANDS.items():
        assert help_text == importlib.import_module(module).HELP, name


def test_sidecar_runs_without_numpy_or_rich(tmp_path: Path) -> None:
    proc = _rollmux(absent(tmp_path, "numpy", "rich"), "sidecar", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--gpu-mem-limit-mib" in proc.stdout


def test_a_command_missing_a_dependency_says_so_in_one_line(tmp_path: Path) -> None:
    proc = _rollmux(absent(tmp_path, "rich"), "simulate", "--help")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rollmux simulate: needs the Python module 'rich', which is not installed (pip install rollmux installs it)"]


def test_the_command_list_survives_a_missing_dependency(tmp_path: Path) -> None:
    proc = _rollmux(absent(tmp_path, "rich"), "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())  # argparse wraps the help column
    assert "sidecar Run a node's sidecar" in text and "unavailable here: no module 'rich'" in text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_parses_alone(name: str) -> None:
    from rollmux.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser(name).parse_args([name, "--help"])
    assert done.value.code == 0
