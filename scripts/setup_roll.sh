#!/usr/bin/env bash
# Set up .venv-roll: the real ROLL (alibaba/ROLL) plus RollMux, for the ROLL adapter tests.
#
#   bash scripts/setup_roll.sh            # called by `scripts/setup.sh --dev`
#   ROLLMUX_ROLL_SRC=/path/to/ROLL bash scripts/setup_roll.sh
#
# ROLL is not on the package index and needs numpy<2 / transformers 4.57 / ray 2.48, so it lives in
# its own virtualenv. Its source comes from ROLLMUX_ROLL_SRC, else the first `shared/thirdparty/ROLL`
# found in a parent of the repository (in CI: ../shared/thirdparty/ROLL). That folder may be
# read-only, so it is copied into the venv (.venv-roll/src/ROLL) and installed editable with --no-deps.
# The dependency set is the one the CPU harness report found sufficient (no vllm, no megatron).
# Idempotent: a venv whose stamp matches this script's inputs is left alone (about a second).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-roll
PY="${PYTHON:-python3}"

find_roll_src() {
  if [[ -n "${ROLLMUX_ROLL_SRC:-}" ]]; then echo "$ROLLMUX_ROLL_SRC"; return; fi
  local dir
  dir="$(pwd)"
  while [[ "$dir" != "/" ]]; do
    dir="$(dirname "$dir")"
    if [[ -f "$dir/shared/thirdparty/ROLL/setup.py" ]]; then echo "$dir/shared/thirdparty/ROLL"; return; fi
  done
}

ROLL_SRC="$(find_roll_src)"
if [[ -z "$ROLL_SRC" || ! -f "$ROLL_SRC/setup.py" ]]; then
  echo "[setup_roll] no ROLL source found (set ROLLMUX_ROLL_SRC to a checkout of alibaba/ROLL);" \
       "the ROLL adapter tests will be skipped" >&2
  exit 0
fi

DEPS=(
  "ray[default]==2.48.0" "numpy<2.0a0,>=1.25" "pyarrow<21" "tensordict>=0.10.0"
  "transformers==4.57.0" "accelerate==0.34.2" "datasets==3.1.0" "peft==0.12.0" "trl==0.9.6"
  "TransferQueue==0.1.6" hydra-core omegaconf dacite codetiming pydantic tqdm more_itertools pybase64
  jsonlines deprecated einops tyro opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp
  math-verify sympy pillow httpx imageio nltk openai langdetect pytest "gem-llm==0.0.4"
  "gymnasium[toy-text]" uvicorn fastapi
)
stamp_of() {
  { printf '%s\n' "${DEPS[@]}" "roll: editable copy"; cat "$ROLL_SRC/setup.py" pyproject.toml;
    cat "$ROLL_SRC/SOURCE.md" 2>/dev/null || true; } | sha256sum | cut -c1-16
}
STAMP="$(stamp_of)"
if [[ -f "$VENV/.rollmux-stamp" && "$(cat "$VENV/.rollmux-stamp")" == "$STAMP" ]] \
   && "$VENV/bin/python" -c 'import roll, rollmux' >/dev/null 2>&1; then
  echo "[setup_roll] $VENV up to date (ROLL from $ROLL_SRC)"
  exit 0
fi

[[ -x "$VENV/bin/python" ]] || { echo "[setup_roll] creating $VENV"; "$PY" -m venv "$VENV"; }
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "[setup_roll] installing torch==2.13.0 (CPU build)"
  "${pip[@]}" torch==2.13.0
fi
echo "[setup_roll] installing the ROLL dependency set (about a minute)"
"${pip[@]}" "${DEPS[@]}"
# Editable, from a copy kept in the venv: ROLL's setup.py uses find_packages, which leaves out package
# folders without an __init__.py (roll/pipeline/agentic/proxy at 8eb27cc2, which AgenticPipeline's
# environment worker imports), so a non-editable install cannot run the agentic pipeline.
echo "[setup_roll] installing ROLL from $ROLL_SRC (copied to $VENV/src/ROLL, editable, --no-deps)"
rm -rf "$VENV/src/ROLL"
mkdir -p "$VENV/src"
cp -r "$ROLL_SRC/." "$VENV/src/ROLL"
chmod -R u+w "$VENV/src/ROLL"
"${pip[@]}" --no-deps -e "$VENV/src/ROLL"
echo "[setup_roll] installing rollmux (editable) into $VENV"
"${pip[@]}" -e .
# (from the venv folder: importing ROLL's agentic modules creates ./output/logs)
(cd "$VENV" && bin/python -c 'import roll, rollmux, roll.pipeline.agentic.proxy.router') \
  || { echo "[setup_roll] import check failed" >&2; exit 1; }
echo "$STAMP" > "$VENV/.rollmux-stamp"
echo "[setup_roll] done"
