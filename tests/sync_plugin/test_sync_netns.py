"""The emulated two-cluster testbed end to end (needs root and iproute2; skipped otherwise)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "sync_netns.py"

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
    pytest.mark.skipif(
        shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2 (ip, tc)"
    ),
]


def namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def test_small_run_moves_one_copy_across_the_cut_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["--trainers", "1", "--rollouts", "2", "--model-mb", "2", "--bucket-mb", "0.5",
            "--cross-mbit", "400", "--intra-mbit", "4000", "--json", str(out)]  # fmt: skip
    p = subprocess.Popen(
        [sys.executable, str(BENCH), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    stdout, _ = p.communicate(timeout=120)
    assert p.returncode == 0, stdout.decode()
    results = {r["scheme"]: r for r in json.loads(out.read_text())["results"]}
    model = 2 * 2**20
    assert all(r["bitwise_ok"] for r in results.values())
    assert abs(results["two_stage"]["cut_bytes"] / model - 1) < 0.02
    assert results["star"]["cut_bytes"] / model > 1.9
    assert namespaces(f"rmxs{p.pid % 10000}") == []


def test_ctrl_c_removes_namespaces() -> None:
    args = ["--rollouts", "2", "--model-mb", "64", "--cross-mbit", "50", "--schemes", "star"]
    p = subprocess.Popen(
        [sys.executable, str(BENCH), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    prefix = f"rmxs{p.pid % 10000}"
    deadline = time.monotonic() + 60
    while len(namespaces(prefix)) < 6 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert namespaces(prefix), "testbed never came up"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) != 0
    assert namespaces(prefix) == []
