#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC stubs of rollmux/proto/*.proto.
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: the repository root, i.e. in place)
# tests/coordinator/service/test_proto_stale.py runs this into a temp dir and diffs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$out"
cd "$root"
"$py" -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" rollmux/proto/rollmux_v1.proto
"$py" -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" rollmux/proto/sidecar_v1.proto
