"""Kubernetes objects as the API server holds them (plain dicts), for the unit tests and the API-server tests."""

from __future__ import annotations

from typing import Any

from rollmux.k8s.api import GPU_RESOURCE, JOB_LABEL, POOL_LABEL, REPLICAS_LABEL, SCHEDULER_NAME


def pod_obj(name: str, job: str | None, *, gpus: int = 8, pool: str | None = None, ns: str = "default",
            annotations: dict[str, str] | None = None, tolerations: list[dict[str, str]] | None = None,
            owner: tuple[str, str] | None = None, uid: str = "", scheduler: str = SCHEDULER_NAME,
            gpu_raw: Any = None, labels: dict[str, str] | None = None,
            requests: dict[str, str] | None = None) -> dict[str, Any]:
    """A pending pod of `job` asking for `gpus` GPUs (in `pool` when given) and `requests` (cpu, memory...)."""
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": dict(labels or {}),
                            "annotations": dict(annotations or {})}
    if uid:
        meta["uid"] = uid
    if job is not None:
        meta["labels"][JOB_LABEL] = job
    if pool is not None:
        meta["labels"][POOL_LABEL] = pool
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner[0], "name": owner[1],
                                    "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]
    gpu = str(gpus) if gpu_raw is None else gpu_raw
    spec: dict[str, Any] = {
        "schedulerName": scheduler, "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "trainer", "resources": {
            "limits": {GPU_RESOURCE: gpu}, "requests": {GPU_RESOURCE: gpu, **(requests or {})}}}],
        "tolerations": list(tolerations or []),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def node_obj(name: str, pool: str, *, gpus: int = 8, replicas: int = 1, ready: bool = True,
             unschedulable: bool = False, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A node of `pool` with `gpus` GPUs, each shared `replicas` ways by time-slicing."""
    labels = {POOL_LABEL: pool}
    if replicas > 1:
        labels[REPLICAS_LABEL] = str(replicas)
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: str(gpus * replicas)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": unschedulable, "taints": list(taints or [])},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def job_obj(name: str, *, parallelism: int = 2, ns: str = "default", scheduler: str = SCHEDULER_NAME,
            annotations: dict[str, str] | None = None, gpus: int = 8) -> dict[str, Any]:
    """A batch/v1 Job of RollMux job `name`: `parallelism` pods, split between the pools by annotations."""
    pod = pod_obj("unused", name, gpus=gpus, ns=ns, annotations=annotations, scheduler=scheduler)
    pod["spec"]["restartPolicy"] = "Never"
    template = {"metadata": {"labels": pod["metadata"]["labels"], "annotations": pod["metadata"]["annotations"]},
                "spec": pod["spec"]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 6,
                     "template": template}}
