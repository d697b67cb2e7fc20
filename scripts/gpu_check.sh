#!/usr/bin/env bash
# The one-command device check (docs/how-to/gpu-check.md): a pre-flight, then five stages, each with its
# own timeout; results land in --out as each stage ends (summary.json, summary.md, gpu_check.log and
# details.tar.gz of each stage's files), so a run cut short still returns what it measured.
#
#   bash scripts/gpu_check.sh --prepare-wheels          # here, with network: the wheels the GPU box lacks
#   bash scripts/gpu_check.sh --out "$OUT"              # on the GPU box (no network), about 5 minutes
#   bash scripts/gpu_check.sh --out DIR --cpu           # the same stages on CPU tensors, with the sidecar's
#                                                       # per-PID stand-in for NVML (CI runs --cpu --small)
#
# Flags: --out DIR (default out/gpu-check), --work DIR (each stage's files; default a new /tmp folder),
# --cpu, --small (scaled-down sizes), --stages 1,3 (a subset),
# --wheels DIR (default out/gpu-check-wheels, ignored by git), --site DIR (where the wheels are installed,
# default /tmp/gpu-check-site; it goes first on PYTHONPATH, so the machine's own packages stay untouched).
# --prepare-wheels takes --target-python X.Y (default 3.12, the GPU image's python3) or --for-this-python
# (the interpreter running this script, as the CPU twin in CI uses it).
#
# --prepare-wheels builds the rollmux wheel from this checkout and downloads, with their dependencies,
# binary wheels of everything rollmux and the stages need for CPython X.Y on manylinux x86_64: numpy,
# rich, grpcio and protobuf at the stubs' versions or newer, pytest ... (not torch or nvidia-ml-py, which
# the GPU image has). The folder must stay under 60 MiB (it travels with the working tree: name it in
# the device tool's carry). On the box the pre-flight (scripts/gpu_check/preflight.py) runs first; when
# something is missing the wheels are installed offline into --site and it runs again; if it still
# fails, its one line says what is missing and the script exits 2 before any stage.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
OUT=$ROOT/out/gpu-check
WHEELS=$ROOT/out/gpu-check-wheels
SITE=/tmp/gpu-check-site
WORK=""
PREPARE=0
TARGET_PY=3.12
RUN_ARGS=()
PRE_ARGS=()
MAX_WHEELS_MIB=60
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --site) SITE=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --prepare-wheels) PREPARE=1; shift ;;
    --target-python) TARGET_PY=$2; shift 2 ;;
    --for-this-python) TARGET_PY=this; shift ;;
    --cpu) RUN_ARGS+=("$1"); PRE_ARGS+=("$1"); shift ;;
    --small) RUN_ARGS+=("$1"); shift ;;
    --stages) RUN_ARGS+=("$1" "$2"); PRE_ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $PREPARE == 1 ]]; then
  [[ -z ${PYTHON:-} && -x $ROOT/.venv/bin/python ]] && PY=$ROOT/.venv/bin/python  # the dev venv builds wheels
  rm -rf "$WHEELS"; mkdir -p "$WHEELS"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$ROOT"
  target=()
  if [[ $TARGET_PY != this ]]; then
    target=(--python-version "$TARGET_PY" --implementation cp)
    for n in 17 24 27 28 31 34 35 39; do target+=(--platform "manylinux_2_${n}_x86_64"); done
    target+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  fi
  "$PY" -m pip download -q --only-binary :all: "${target[@]}" -d "$WHEELS" \
    "$WHEELS"/rollmux-*.whl pytest pytest-timeout setuptools wheel
  mib=$(du -sm "$WHEELS" | cut -f1)
  ls "$WHEELS"
  echo "gpu_check.sh: $(ls "$WHEELS" | wc -l) wheels, ${mib} MiB in $WHEELS (limit ${MAX_WHEELS_MIB} MiB)"
  if (( mib > MAX_WHEELS_MIB )); then echo "gpu_check.sh: the wheels exceed ${MAX_WHEELS_MIB} MiB" >&2; exit 1; fi
  exit 0
fi

mkdir -p "$OUT"
WORK=${WORK:-$(mktemp -d /tmp/gpu-check-work.XXXXXX)}
preflight() { (cd "$ROOT" && "$PY" scripts/gpu_check/preflight.py --out "$WORK" "${PRE_ARGS[@]}") 2>&1; }
if ! line=$(preflight); then
  echo "$line"
  shopt -s nullglob
  wheels=()
  for w in "$WHEELS"/*.whl; do [[ $(basename "$w") == rollmux-* ]] || wheels+=("$w"); done
  if [[ ${#wheels[@]} -gt 0 ]]; then
    echo "gpu_check.sh: installing ${#wheels[@]} wheels from $WHEELS into $SITE (offline)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  fi
  if ! (cd /tmp && "$PY" -c 'import rollmux.sidecar' 2>/dev/null); then
    # Editable from the checkout, as the test suite runs it (pytest puts the checkout first on sys.path,
    # where the rollmux/ folder alone would shadow an installed wheel).
    echo "gpu_check.sh: installing rollmux from $ROOT (editable, offline)"
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e "$ROOT"
  fi
  if ! line=$(preflight); then
    echo "$line" >&2
    exit 2
  fi
fi
echo "$line"
cd "$ROOT"
exec "$PY" scripts/gpu_check/run.py --out "$OUT" --work "$WORK" "${RUN_ARGS[@]}"
