#!/usr/bin/env bash
# A real Kubernetes control plane for tests/k8s and benchmarks/k8s_scheduler.py; called by
# `scripts/setup.sh --dev`.
#
#   kube-apiserver, kube-controller-manager   built from Debian's `kubernetes` source package (1.20.2,
#                                             the newest Kubernetes source a registry here offers)
#   etcd                                      Debian's etcd-server (3.4)
#
# The binaries land in a cache outside the checkout, $ROLLMUX_KUBE_DIR (default
# ~/.cache/rollmux/kube-1.20.2/bin), and a build already there is reused (the build takes about
# 10 minutes on 2 cores; a cached one costs nothing). Why the reflect2 swap: the vendored
# github.com/modern-go/reflect2 1.0.1 calls reflect.mapiterinit through linkname, which Go 1.19's
# runtime no longer provides in that form, so the server crashes on its first map encode; Debian's
# golang-github-modern-go-reflect2-dev (1.0.2) is the fixed release.
set -euo pipefail

KUBE_VERSION=1.20.2
dir="${ROLLMUX_KUBE_DIR:-$HOME/.cache/rollmux/kube-$KUBE_VERSION}"
bin="$dir/bin"

if [[ -x $bin/kube-apiserver && -x $bin/kube-controller-manager ]]; then
  echo "[build-kube] kube-apiserver and kube-controller-manager $KUBE_VERSION cached in $bin"
else
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[build-kube] building Kubernetes $KUBE_VERSION needs apt-get as root (deb-src, golang-go, rsync); tests/k8s will be skipped" >&2
    exit 0
  fi
  src_list=/etc/apt/sources.list.d/rollmux-debian-src.sources
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ /etc/apt/sources.list; then
    echo "[build-kube] adding a deb-src entry ($src_list)"
    cat >"$src_list" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  echo "[build-kube] installing golang-go, rsync, golang-github-modern-go-reflect2-dev, dpkg-dev (apt)"
  apt-get update -qq >/dev/null
  apt-get install -y -qq golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev >/dev/null

  work="$dir/src"
  rm -rf "$work"
  mkdir -p "$work" "$bin"
  echo "[build-kube] apt-get source kubernetes into $work"
  (cd "$work" && apt-get source -qq kubernetes >/dev/null)
  tree=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -1)
  [[ -n $tree ]] || { echo "[build-kube] no kubernetes source tree in $work" >&2; exit 1; }

  reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
  [[ -d $reflect2 ]] || { echo "[build-kube] $reflect2 missing (golang-github-modern-go-reflect2-dev)" >&2; exit 1; }
  echo "[build-kube] replacing the vendored modern-go/reflect2 with Debian's ($reflect2)"
  rsync -a --delete "$reflect2/" "$tree/vendor/github.com/modern-go/reflect2/"

  echo "[build-kube] building kube-apiserver and kube-controller-manager (about 10 minutes on 2 cores)"
  # Kubernetes 1.20 builds in GOPATH mode with its vendor tree (as Debian's rules do); make also
  # generates the OpenAPI definitions the API server needs, which the source does not carry.
  mkdir -p "$tree/.go/src/k8s.io" "$dir/home"
  ln -sfn ../../.. "$tree/.go/src/k8s.io/kubernetes"
  (cd "$tree" && env HOME="$dir/home" GOPATH="$tree/.go" CGO_ENABLED=0 GOCACHE="$dir/gocache" \
    KUBE_GIT_VERSION="v$KUBE_VERSION" KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager")
  install -m 0755 "$tree/_output/bin/kube-apiserver" "$tree/_output/bin/kube-controller-manager" "$bin/"
  rm -rf "$work" "$dir/gocache"
  "$bin/kube-apiserver" --version
fi

if ! command -v etcd >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "[build-kube] installing etcd-server (apt)"
    apt-get update -qq >/dev/null && apt-get install -y -qq etcd-server >/dev/null
    # the package starts a system etcd on 2379; the tests run their own on free loopback ports
    (systemctl disable --now etcd >/dev/null 2>&1 || service etcd stop >/dev/null 2>&1 || true)
  else
    echo "[build-kube] etcd not found: install it (e.g. 'sudo apt-get install etcd-server'); tests/k8s will be skipped" >&2
  fi
fi
echo "[build-kube] done"
