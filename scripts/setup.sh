#!/usr/bin/env bash
# Set up a local virtual environment for RollMux.
#
#   bash scripts/setup.sh          # runtime: rollmux + torch (CPU build if none) + plots
#   bash scripts/setup.sh --dev    # + test tools, and redis-server for the integration tests
#
# Torch: if the venv has no torch, install torch==2.13.0 (the CPU build available on this
# platform's wheel mirror) so that nothing pulls a multi-GB CUDA build. The package itself only
# asks for a range (torch>=2.3), so a GPU image keeps its own CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[[ "${1:-}" == "--dev" ]] && dev=1
PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
  echo "[setup] installing torch==2.13.0 (CPU build)"
  "${pip[@]}" torch==2.13.0
fi
extras="torch,plots"
(( dev )) && extras="torch,plots,nvml,dev"
echo "[setup] installing rollmux[$extras] (editable)"
"${pip[@]}" -e ".[$extras]"
(( dev )) && bash scripts/setup_verl.sh  # veRL 0.9.1 for the veRL adapter tests (torch kept)
if (( dev )) && ! command -v redis-server >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing redis-server (apt)"
    apt-get update -qq >/dev/null && apt-get install -y -qq redis-server >/dev/null
  else
    echo "[setup] redis-server not found: install it (e.g. 'sudo apt-get install redis-server'); Redis tests will be skipped" >&2
  fi
fi
(( dev )) && bash scripts/setup_chart.sh  # helm, kubernetes-validate, hadolint for tests/charts
(( dev )) && bash scripts/setup_roll.sh  # .venv-roll: the real ROLL for the ROLL adapter tests
(( dev )) && bash scripts/build_kube.sh  # kube-apiserver 1.20.2 + etcd for tests/k8s (cached outside the checkout)
echo "[setup] done"
