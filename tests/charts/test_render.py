"""`helm lint --strict`, `helm template` for each ci/ values file, every object against the Kubernetes schemas."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest

from .conftest import CHART, CI_VALUES, CRD_KINDS, K8S_VERSIONS, ci_values, helm, name, render

SCHEDULER_RBAC = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")  # the scheduler's identity and rights (the Role: its Lease)
EXPECTED_KINDS = {
    "defaults": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", *SCHEDULER_RBAC},
    "external-redis": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", *SCHEDULER_RBAC},
    "external-redis-secret": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", *SCHEDULER_RBAC},
    "tls": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", *SCHEDULER_RBAC},
    "standby": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", *SCHEDULER_RBAC},
    "time-slicing": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", *SCHEDULER_RBAC},
    "rollout-only": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", *SCHEDULER_RBAC},
    "everything": {"Secret", "ConfigMap", "Service", "Deployment", "DaemonSet", "StatefulSet", "ServiceMonitor",
                   "PrometheusRule", "NetworkPolicy", *SCHEDULER_RBAC},
}


def label(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def test_every_ci_values_file_has_expectations() -> None:
    assert {label(p) for p in CI_VALUES} == set(EXPECTED_KINDS)


@pytest.mark.parametrize("values", CI_VALUES, ids=label)
def test_helm_lint_strict(values: Path) -> None:
    proc = helm("lint", "--strict", str(CHART), "-f", str(values), "--namespace", "rollmux")
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=label)
def test_rendered_kinds(values: Path) -> None:
    assert render(values).kinds() == EXPECTED_KINDS[label(values)]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("values", CI_VALUES, ids=label)
def test_every_object_validates_against_the_kubernetes_schemas(values: Path, version: str) -> None:
    for doc in render(values).docs:
        if doc["kind"] in CRD_KINDS:
            continue  # checked field by field in test_objects.py
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} against Kubernetes {version}: {path}: {exc.message}")


def test_the_validator_refuses_a_bad_object() -> None:
    """The schema check can fail: an unknown field and a wrong type in a rendered Deployment."""
    deployment = copy.deepcopy(render(ci_values("defaults")).one("Deployment", name("coordinator")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/livez"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    deployment = copy.deepcopy(render(ci_values("defaults")).one("Deployment", name("coordinator")))
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_a_missing_external_redis_fails_rendering_with_a_remedy() -> None:
    proc = helm("template", "rm", str(CHART), "--set", "redis.enabled=false", check=False)
    assert proc.returncode != 0
    assert "/redis/external" in proc.stderr


def test_the_chart_refuses_kubernetes_older_than_1_20() -> None:
    helm("template", "rm", str(CHART), "--kube-version", "1.20.0")
    proc = helm("template", "rm", str(CHART), "--kube-version", "1.19.16", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr, proc.stderr
