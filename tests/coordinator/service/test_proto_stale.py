"""The committed stubs match what scripts/gen_proto.sh generates from rollmux_v1.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STUBS = ("rollmux_v1_pb2.py", "rollmux_v1_pb2_grpc.py", "rollmux_v1_pb2.pyi")


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the stubs")
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    for name in STUBS:
        fresh = (tmp_path / "rollmux" / "proto" / name).read_text()
        committed = (ROOT / "rollmux" / "proto" / name).read_text()
        assert fresh == committed, f"rollmux/proto/{name} is stale: run scripts/gen_proto.sh and commit"
