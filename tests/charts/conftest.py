"""The real helm binary (installed by scripts/setup_chart.sh) rendering charts/rollmux, and helpers."""

from __future__ import annotations

import base64
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rollmux"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BIN = Path(sys.executable).parent
HELM = BIN / "helm"
RELEASE, NAMESPACE = "rm", "rollmux"
# Schemas validated against (kubernetes-validate ships 1.25 and newer); the chart's floor, 1.20, is checked
# by installing it on a real kube-apiserver 1.20.2 (tests/k8s/test_helm_live.py).
K8S_VERSIONS = ("1.30.0", "1.34.0")
CRD_KINDS = frozenset({"ServiceMonitor", "PrometheusRule"})  # not in the Kubernetes API schemas


def need(tool: Path) -> Path:
    if not tool.exists():
        pytest.fail(f"{tool} not found: run `bash scripts/setup.sh --dev` (it calls scripts/setup_chart.sh)")
    return tool


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(need(HELM)), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@dataclass(frozen=True)
class Rendered:
    """The objects `helm template` produced, by kind and name."""

    docs: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: found {len(found)} in {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [f"{d['kind']}/{d['metadata']['name']}" for d in self.docs]

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self.docs}

    def workloads(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]

    def secret_value(self, name: str, key: str) -> str:
        return base64.b64decode(self.one("Secret", name)["data"][key]).decode()


@functools.lru_cache(maxsize=64)
def render(*values_files: Path, sets: tuple[str, ...] = ()) -> Rendered:
    """Render the chart (cached: tests must not mutate the result)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return Rendered([d for d in yaml.safe_load_all(out) if d])


def ci_values(name: str) -> Path:
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.exists(), path
    return path


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return c


def name(component: str) -> str:
    return f"{RELEASE}-rollmux-{component}"
