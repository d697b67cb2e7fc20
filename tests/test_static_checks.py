"""Lint and type checks run as tests so CI enforces them (ruff everywhere, mypy on the pure core)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PURE = ["rollmux/core", "coordinator/policy",
        "k8s/api.py", "k8s/objects.py", "k8s/gang.py", "k8s/spec.py", "k8s/nodefilter.py", "k8s/assign.py"]


def _tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (bash scripts/setup.sh --dev installs it)")
    return str(path)


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_on_the_pure_policy_core() -> None:
    proc = subprocess.run([_tool("mypy"), *PURE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
