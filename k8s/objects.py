"""Kubernetes objects (JSON dicts from the API server) to the scheduler's views, and nothing else.

Pure: no client, no clock. Requests follow kube-scheduler's rules for an extended resource: an
integer, requests default to limits, init containers count at their largest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollmux.k8s.api import GPU_RESOURCE, Code, NodeView, Owner, PodView, SchedulerError, Taint, Toleration


def _int_quantity(raw: Any, what: str) -> int:
    """An integer quantity ("8", 8); extended resources may not be fractional."""
    text = str(raw).strip()
    if not text.isdigit():
        raise SchedulerError(Code.BAD_INPUT, f"{what}={raw!r} is not a whole number")
    return int(text)


def _container_gpus(container: Mapping[str, Any], where: str) -> int:
    res = container.get("resources") or {}
    req = (res.get("requests") or {}).get(GPU_RESOURCE)
    if req is None:
        req = (res.get("limits") or {}).get(GPU_RESOURCE)
    return 0 if req is None else _int_quantity(req, f"{where} {GPU_RESOURCE}")


def pod_gpus(spec: Mapping[str, Any], key: str = "pod") -> int:
    """GPUs a pod requests: max(sum over containers, largest init container)."""
    main = sum(_container_gpus(c, f"{key} container {c.get('name', '?')}") for c in spec.get("containers") or ())
    init = max((_container_gpus(c, f"{key} init container {c.get('name', '?')}")
                for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def _pairs(raw: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (raw or {}).items()))


def _owner(meta: Mapping[str, Any]) -> Owner | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return Owner(kind=ref.get("kind", ""), name=ref.get("name", ""), api_version=ref.get("apiVersion", ""))
    return None


def pod_view(obj: Mapping[str, Any]) -> PodView:
    """A pod as the scheduler sees it.

    Raises:
        SchedulerError: BAD_INPUT, a GPU request that is not a whole number.
    """
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return PodView(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        scheduler_name=spec.get("schedulerName") or "default-scheduler", node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending", deleting=bool(meta.get("deletionTimestamp")),
        labels=_pairs(meta.get("labels")), annotations=_pairs(meta.get("annotations")),
        node_selector=_pairs(spec.get("nodeSelector")),
        tolerations=tuple(Toleration(key=t.get("key") or "", operator=t.get("operator") or "Equal",
                                     value=t.get("value") or "", effect=t.get("effect") or "")
                          for t in spec.get("tolerations") or ()),
        gpus=pod_gpus(spec, key), owner=_owner(meta))


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """A node as the scheduler sees it (a GPU count that does not parse counts as none)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    alloc = status.get("allocatable") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    gpus, pods = str(alloc.get(GPU_RESOURCE, "0")), str(alloc.get("pods", "110"))
    return NodeView(
        name=meta.get("name", ""), labels=_pairs(meta.get("labels")), ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect") or "")
                     for t in spec.get("taints") or ()),
        allocatable_gpus=int(gpus) if gpus.isdigit() else 0, allocatable_pods=int(pods) if pods.isdigit() else 110)


def owner_gang_size(kind: str, obj: Mapping[str, Any]) -> int:
    """Pods a controller runs at once: a Job's parallelism (capped by completions left), a
    RayCluster's head plus its workers (replicas clamped to [min, max], times hosts), a RayJob's cluster.

    Raises:
        SchedulerError: BAD_INPUT, an owner kind the scheduler does not size (set rollmux.io/gang-size).
    """
    spec = obj.get("spec") or {}
    if kind == "Job":
        size = int(spec.get("parallelism", 1))
        if spec.get("completions") is not None:
            left = int(spec["completions"]) - int((obj.get("status") or {}).get("succeeded", 0))
            size = min(size, max(left, 0))
        return size
    if kind == "RayJob":
        return owner_gang_size("RayCluster", {"spec": spec.get("rayClusterSpec") or {}})
    if kind == "RayCluster":
        if spec.get("suspend"):
            return 0
        workers = 0
        for group in spec.get("workerGroupSpecs") or ():
            lo, hi = int(group.get("minReplicas", 0)), int(group.get("maxReplicas", 2**31 - 1))
            workers += min(max(int(group.get("replicas", 0)), lo), hi) * int(group.get("numOfHosts", 1))
        return 1 + workers
    raise SchedulerError(Code.BAD_INPUT, f"owner kind {kind!r} has no known gang size: "
                                         "annotate the pods with rollmux.io/gang-size")
