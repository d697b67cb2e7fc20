"""Opt-in check, fail-fast sidecar check, job naming and the job environment handed to Ray actors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rollmux.adapters.common import AdapterError, JobIdentity
from rollmux.adapters.common import registration as reg
from tests.adapters.conftest import run_fresh


def test_adapter_machinery_imports_nothing_heavy() -> None:
    res = run_fresh('''
import sys
import rollmux.adapters.common, rollmux.adapters.common.registration
from rollmux.adapters.common import opted_in
assert not opted_in()
heavy = [m for m in ("grpc", "torch", "ray", "verl") if m in sys.modules]
assert not heavy, heavy
''')
    assert res.returncode == 0, res.stderr


def test_check_sidecar_names_the_socket(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.sock")
    with pytest.raises(AdapterError, match=f"no sidecar socket exists at that path.*{missing}"):
        reg.check_sidecar(missing)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens
    with pytest.raises(AdapterError, match="refused the connection"):
        reg.check_sidecar(str(stale))


def test_job_name_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLMUX_JOB", raising=False)
    a, b = reg.job_name("my proj", "exp/1"), reg.job_name("my proj", "exp/1")
    assert a.startswith("my_proj-exp_1-") and a != b
    monkeypatch.setenv("ROLLMUX_JOB", "given")
    assert reg.job_name("x") == "given"
    monkeypatch.setenv("ROLLMUX_SIDECAR_SOCKET", "/run/s.sock")
    ident = JobIdentity(job="given", token="s3cret")
    envs = reg.job_env(ident)
    assert envs["ROLLMUX_SIDECAR_SOCKET"] == "/run/s.sock" and envs["ROLLMUX_JOB_TOKEN"] == "s3cret"
    assert "s3cret" not in repr(ident)
    merged = reg.merge_runtime_env({"env_vars": {"A": "1"}, "pip": ["x"]}, {"B": "2"})
    assert merged == {"env_vars": {"A": "1", "B": "2"}, "pip": ["x"]}


def test_slo_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMUX_SLO", "0.5")
    with pytest.raises(AdapterError, match="ROLLMUX_SLO='0.5' is invalid"):
        reg.slo()
    monkeypatch.setenv("ROLLMUX_SLO", "2")
    assert reg.slo() == 2.0
