"""Kubernetes objects (JSON dicts from the API server) to the scheduler's views, and nothing else.

Pure: no client, no clock. Requests follow kubelet admission's rules: requests default to limits,
init containers count at their largest, ``spec.overhead`` adds on; an extended resource is whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from math import ceil
from typing import Any

from rollmux.core.model import Pool
from rollmux.k8s.api import (
    PODS,
    POOL_LABEL,
    Code,
    Conventions,
    HostPort,
    NodeView,
    Owner,
    PodView,
    Requirement,
    SchedulerError,
    Taint,
    Toleration,
)

_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
           "P": Decimal("1e15"), "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
           "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60)}


def milli(raw: Any, what: str) -> int:
    """A Kubernetes quantity ("500m", "64Gi", "1.5", "1e3", 8) in milli-units, rounded up as the API server does.

    Raises:
        SchedulerError: BAD_INPUT, a quantity that does not parse.
    """
    text = str(raw).strip()
    number, suffix = text, ""
    for cut in (2, 1):
        if len(text) > cut and text[-cut:] in _SUFFIX and (cut == 2 or text[-2:] not in _SUFFIX):
            number, suffix = text[:-cut], text[-cut:]
            break
    try:
        value = Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        raise SchedulerError(Code.BAD_INPUT, f"{what}={raw!r} is not a Kubernetes quantity") from None
    if value < 0 or not value.is_finite():
        raise SchedulerError(Code.BAD_INPUT, f"{what}={raw!r} is negative")
    return ceil(value * 1000)


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    """Requests, each defaulting to its limit (as the API server defaults them)."""
    res = container.get("resources") or {}
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return {str(k): milli(v, f"{where} {k}") for k, v in merged.items()}


def pod_requests(spec: Mapping[str, Any], key: str = "pod") -> dict[str, int]:
    """What a pod takes of a node, per resource (milli-units): max(sum over containers, largest init
    container), plus ``spec.overhead``, as kubelet admission counts it."""
    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for res, v in _container_requests(c, f"{key} container {c.get('name', '?')}").items():
            total[res] = total.get(res, 0) + v
    for c in spec.get("initContainers") or ():
        for res, v in _container_requests(c, f"{key} init container {c.get('name', '?')}").items():
            total[res] = max(total.get(res, 0), v)
    for res, v in (spec.get("overhead") or {}).items():
        total[str(res)] = total.get(str(res), 0) + milli(v, f"{key} overhead {res}")
    return {res: v for res, v in total.items() if v}


def _whole(value: int, what: str) -> int:
    if value % 1000:
        raise SchedulerError(Code.BAD_INPUT, f"{what}={value / 1000:g} is not a whole number")
    return value // 1000


def pod_gpus(spec: Mapping[str, Any], key: str = "pod", gpu_resource: str = Conventions().gpu_resource) -> int:
    """GPUs a pod requests: max(sum over containers, largest init container); an extended resource is whole."""
    for c in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
        raw = _container_requests(c, f"{key} container {c.get('name', '?')}").get(gpu_resource)
        if raw is not None:
            _whole(raw, f"{key} container {c.get('name', '?')} {gpu_resource}")
    return _whole(pod_requests(spec, key).get(gpu_resource, 0), f"{key} {gpu_resource}")


def _pairs(raw: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (raw or {}).items()))


def _owner(meta: Mapping[str, Any]) -> Owner | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return Owner(kind=ref.get("kind", ""), name=ref.get("name", ""), api_version=ref.get("apiVersion", ""))
    return None


def _pool(raw: str | None) -> Pool | None:
    return Pool(raw) if raw in (Pool.ROLLOUT.value, Pool.TRAIN.value) else None


def _host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    out = []
    for c in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
        for p in c.get("ports") or ():
            if p.get("hostPort"):
                out.append(HostPort(int(p["hostPort"]), p.get("protocol") or "TCP", p.get("hostIP") or ""))
    return tuple(out)


def _affinity(spec: Mapping[str, Any]) -> tuple[tuple[Requirement, ...], ...]:
    """Required node affinity terms (``requiredDuringSchedulingIgnoredDuringExecution``)."""
    required = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution")) or {})
    terms = []
    for term in required.get("nodeSelectorTerms") or ():
        reqs = [Requirement(r.get("key", ""), r.get("operator", ""), tuple(map(str, r.get("values") or ())))
                for r in term.get("matchExpressions") or ()]
        reqs += [Requirement(r.get("key", ""), r.get("operator", ""), tuple(map(str, r.get("values") or ())),
                             field=True) for r in term.get("matchFields") or ()]
        terms.append(tuple(reqs))
    return tuple(terms)


def pod_view(obj: Mapping[str, Any], conv: Conventions = Conventions()) -> PodView:  # noqa: B008 (frozen)
    """A pod as the scheduler sees it.

    Raises:
        SchedulerError: BAD_INPUT, a request that does not parse, or a GPU request that is not whole.
    """
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    labels = meta.get("labels") or {}
    requests = pod_requests(spec, key)
    return PodView(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
        scheduler_name=spec.get("schedulerName") or "default-scheduler", node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending", deleting=bool(meta.get("deletionTimestamp")),
        labels=_pairs(labels), annotations=_pairs(meta.get("annotations")),
        node_selector=_pairs(spec.get("nodeSelector")),
        tolerations=tuple(Toleration(key=t.get("key") or "", operator=t.get("operator") or "Equal",
                                     value=t.get("value") or "", effect=t.get("effect") or "")
                          for t in spec.get("tolerations") or ()),
        gpus=pod_gpus(spec, key, conv.gpu_resource), requests=tuple(sorted(requests.items())),
        host_ports=_host_ports(spec), affinity=_affinity(spec), priority=int(spec.get("priority") or 0),
        created=str(meta.get("creationTimestamp") or ""),
        gates=tuple(str(g.get("name", "")) for g in spec.get("schedulingGates") or ()),
        pool=_pool(labels.get(POOL_LABEL) or (spec.get("nodeSelector") or {}).get(conv.pool_label)),
        owner=_owner(meta))


def node_view(obj: Mapping[str, Any], conv: Conventions = Conventions()) -> NodeView:  # noqa: B008 (frozen)
    """A node as the scheduler sees it (an allocatable quantity that does not parse counts as none)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    alloc: dict[str, int] = {}
    for res, raw in (status.get("allocatable") or {}).items():
        try:
            alloc[str(res)] = milli(raw, res)
        except SchedulerError:
            alloc[str(res)] = 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    labels = meta.get("labels") or {}
    replicas = str(labels.get(conv.replicas_label, "1"))
    return NodeView(
        name=meta.get("name", ""), labels=_pairs(labels), ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect") or "")
                     for t in spec.get("taints") or ()),
        allocatable=tuple(sorted(alloc.items())), allocatable_gpus=alloc.get(conv.gpu_resource, 0) // 1000,
        allocatable_pods=alloc.get(PODS, 110_000) // 1000,
        replicas=int(replicas) if replicas.isdigit() and int(replicas) > 0 else 1,
        pool=_pool(labels.get(conv.pool_label)))


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
    if kind == "PodGroup":  # scheduling.x-k8s.io/v1alpha1: the pods that must run together
        return max(int(spec.get("minMember", 1)), 1)
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
