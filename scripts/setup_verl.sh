#!/usr/bin/env bash
# Install veRL 0.9.1 (and TransferQueue, which its v1 trainer needs) into .venv for the veRL adapter
# tests, keeping the venv's torch build: pip gets a constraint pinning the torch already installed,
# so nothing can replace the CPU build with a CUDA one. Called by `scripts/setup.sh --dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"
if "$py" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("verl") == "0.9.1" else 1)' 2>/dev/null \
   && "$py" -c "import transfer_queue, uvicorn, fastapi" 2>/dev/null; then
  echo "[setup] veRL 0.9.1 already installed"
else
  echo "[setup] installing verl==0.9.1 + TransferQueue (torch kept at $torch_version)"
  "$py" -m pip install -q --disable-pip-version-check -c "$constraints" "verl==0.9.1" "TransferQueue>=0.1.10" pyzmq msgspec fastapi uvicorn cachetools
  "$py" -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$torch_version' else 'pip replaced torch: ' + torch.__version__)"
fi
# verl 0.9.1 and TransferQueue ship their own test suites as a top-level `tests` package in
# site-packages; it shadows this repo's `tests` package in subprocesses (multiprocessing children of
# the tests fail with "No module named 'tests.sync_plugin'"). Nothing at runtime imports it: remove it.
"$py" - <<'PY'
import importlib.metadata as m, pathlib, shutil, sysconfig
owners = [d for d in ("verl", "transferqueue") if "tests" in (m.distribution(d).read_text("top_level.txt") or "").split()]
stray = pathlib.Path(sysconfig.get_paths()["purelib"]) / "tests"
if owners and stray.is_dir() and not (stray / "sync_plugin").exists():
    shutil.rmtree(stray)
    print(f"[setup] removed the stray site-packages/tests installed by {', '.join(owners)}")
PY
