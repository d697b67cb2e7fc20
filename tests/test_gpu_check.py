"""``scripts/gpu_check.sh --cpu --small``: the device check's stages on CPU tensors, with the sidecar's
per-PID stand-in provider in place of NVML, so the script cannot rot between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_cpu_mode_passes_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--small", "--out", str(out)],
                          cwd=tmp_path, env={**env, "PYTHON": _python()}, capture_output=True, text=True,
                          timeout=580)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    stages = {s["stage"]: s for s in summary["stages"]}
    assert summary["ok"] and list(stages) == ["1-env", "2-cuda-tests", "3-state-cache", "4-multiplex", "5-sync"]
    assert stages["1-env"]["figures"]["memory_provider"] == "StandInMemoryProvider"
    assert stages["3-state-cache"]["figures"]["bitwise_identical"]
    mux = stages["4-multiplex"]["figures"]
    assert mux["not_freed_pids"] == [mux["control_pid"]]  # the negative control, and only it
    assert mux["overlapping_phases"] == 0 and mux["order_violations"] == 0
    assert stages["5-sync"]["figures"]["bitwise_identical"]
    assert "PASS" in proc.stdout and "[FAIL]" not in proc.stdout


def test_a_failing_stage_fails_the_run(tmp_path: Path) -> None:
    """Stage 1 on a machine without CUDA and without --cpu fails, and so does the script."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: stage 1 would pass")
    out = tmp_path / "gpu-check"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--stages", "1", "--out", str(out)],
                          cwd=tmp_path, env={**os.environ, "PYTHON": _python()}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["ok"] and summary["stages"][0]["stage"] == "1-env"
    assert "[FAIL] 1-env" in proc.stdout


def _python() -> str:
    import sys

    return sys.executable
