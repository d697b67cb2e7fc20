#!/usr/bin/env bash
# The one-command device check (docs/how-to/gpu-check.md): five stages, each with its own timeout,
# results written to --out as each stage ends (gpu_check.log, summary.json, one JSON per stage).
#
#   bash scripts/gpu_check.sh --out out/gpu-check            # on a GPU machine (about 6 minutes)
#   bash scripts/gpu_check.sh --out out/gpu-check --cpu      # the same stages on CPU tensors, with the
#                                                            # sidecar's per-PID stand-in for NVML
#   bash scripts/gpu_check.sh --prepare-wheels               # here, before sending the checkout to a
#                                                            # machine without network (see below)
#
# Flags: --out DIR (default out/gpu-check), --cpu, --small (scaled-down sizes, as the test suite runs
# it), --stages 1,3 (a subset), --wheels DIR (default out/gpu-check-wheels, ignored by git like out/).
#
# A GPU machine without network gets what its image lacks from --wheels: --prepare-wheels fills it here
# with the rollmux wheel built from this checkout (pip wheel --no-deps) and the small pure-Python wheels
# the check needs (grpcio-health-checking, prometheus-client, pytest and its plugins); send the folder
# along with the checkout. If rollmux is not importable, the script installs it editable from the
# checkout (pip install -e --no-build-isolation: setuptools from the image, as for pip wheel), else the
# prepared wheel.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
OUT=$ROOT/out/gpu-check
WHEELS=$ROOT/out/gpu-check-wheels
PREPARE=0
RUN_ARGS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --prepare-wheels) PREPARE=1; shift ;;
    --cpu|--small) RUN_ARGS+=("$1"); shift ;;
    --stages) RUN_ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done


if [[ $PREPARE == 1 ]]; then
  mkdir -p "$WHEELS"
  health=$("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-health-checking"))' 2>/dev/null || true)
  "$PY" -m pip download -q --no-deps --only-binary :all: -d "$WHEELS" \
    "grpcio-health-checking${health:+==$health}" prometheus-client pytest pluggy iniconfig pygments pytest-timeout
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$ROOT"
  du -sh "$WHEELS"; ls "$WHEELS"
  exit 0
fi

missing() {  # module names the check imports that this python lacks
  "$PY" - <<'EOF'
import importlib.util
mods = {"rollmux.sidecar": "rollmux", "grpc_health": "grpcio-health-checking",
        "prometheus_client": "prometheus-client", "pytest": "pytest"}
print(" ".join(p for m, p in mods.items() if importlib.util.find_spec(m.split(".")[0]) is None
               or (m == "rollmux.sidecar" and importlib.util.find_spec(m) is None)))
EOF
}
mkdir -p "$OUT"
need=$(cd /tmp && missing)
if [[ -n $need ]]; then
  echo "gpu_check.sh: installing $need (no network: from $WHEELS)"
  pkgs=()
  for p in $need; do
    case $p in
      pytest) pkgs+=(pytest pluggy iniconfig pygments pytest-timeout) ;;
      rollmux) ;;
      *) pkgs+=("$p") ;;
    esac
  done
  [[ ${#pkgs[@]} -gt 0 ]] && "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" "${pkgs[@]}"
  if [[ " $need " == *" rollmux "* ]]; then
    # Editable from the checkout, as the test suite runs it (pytest puts the checkout first on sys.path,
    # where the rollmux/ folder alone would shadow an installed wheel); the prepared wheel otherwise.
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e "$ROOT" \
      || "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" rollmux
  fi
fi
cd "$ROOT"
exec "$PY" scripts/gpu_check/run.py --out "$OUT" "${RUN_ARGS[@]}"
