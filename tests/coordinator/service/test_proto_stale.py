"""The committed stubs match what scripts/gen_proto.sh generates from rollmux_v1.proto.

The generators stamp their own version into the stubs (grpcio-tools' `GRPC_GENERATED_VERSION`,
protoc's runtime-version check); those stamps follow whatever grpcio-tools the set-up installed, so
they are compared apart from the code: a newer generator alone must not fail CI, a changed .proto
must.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STUBS = ("rollmux_v1_pb2.py", "rollmux_v1_pb2_grpc.py", "rollmux_v1_pb2.pyi",
         "sidecar_v1_pb2.py", "sidecar_v1_pb2_grpc.py", "sidecar_v1_pb2.pyi")
VERSION_STAMPS = (
    (re.compile(r"GRPC_GENERATED_VERSION = '[^']*'"), "GRPC_GENERATED_VERSION = '<v>'"),
    (re.compile(r"# Protobuf Python Version: .*"), "# Protobuf Python Version: <v>"),
    (re.compile(r"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)\s*\d+,\s*\d+,\s*\d+,"),
     r"\1 <v>,"),
)


def without_version_stamps(text: str) -> str:
    for pattern, stamp in VERSION_STAMPS:
        text = pattern.sub(stamp, text)
    return text


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the stubs")
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    for name in STUBS:
        fresh = without_version_stamps((tmp_path / "rollmux" / "proto" / name).read_text())
        committed = without_version_stamps((ROOT / "rollmux" / "proto" / name).read_text())
        assert fresh == committed, f"rollmux/proto/{name} is stale: run scripts/gen_proto.sh and commit"


def test_version_stamps_are_the_only_thing_ignored() -> None:
    stub = (ROOT / "rollmux" / "proto" / "rollmux_v1_pb2_grpc.py").read_text()
    bumped = re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = '9.99.9'", stub)
    assert without_version_stamps(bumped) == without_version_stamps(stub)
    edited = stub.replace("AcquirePermit", "AcquirePermits", 1)
    assert without_version_stamps(edited) != without_version_stamps(stub)
