"""What kube-scheduler would check before a pod runs on a node, for the nodes the policy chose.

Pure, one small rule per reason (the reason strings are kube-scheduler 1.20's, so `kubectl describe`
reads the same as for its own pods): Ready, not cordoned, taints tolerated, node selector, required
node affinity, host ports, every requested resource (pod overhead included) against allocatable minus
every bound pod of any scheduler, as kubelet admits it, and time-slicing: a node hosts at most as many
jobs as its GPUs have replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rollmux.k8s.api import PODS, NodeUsage, NodeView, PodView, Requirement, Taint, Toleration

NOT_READY = "node(s) were not ready"
UNSCHEDULABLE = "node(s) were unschedulable"
SELECTOR = "node(s) didn't match node selector"  # nodeSelector or required node affinity (1.20's wording)
PORTS = "node(s) didn't have free ports for the requested pod ports"
INSUFFICIENT = "Insufficient "  # + the resource name
INSUFFICIENT_GPU = "Insufficient nvidia.com/gpu"
TOO_MANY_PODS = "Too many pods"
NODE_LEVEL = frozenset({NOT_READY, UNSCHEDULABLE})
"""Reasons Kubernetes refuses a node for every pod (the coordinator is told; a taint is one too)."""
REPLICAS = "node(s) already host as many jobs as their GPUs have time-slicing replicas"
UNKNOWN = "node(s) not found"
_CORDON = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """kube's rule: effect empty or equal, key empty (with Exists) or equal, Exists or equal value."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if not toleration.key and toleration.operator != "Exists":
        return False
    return toleration.operator == "Exists" or toleration.value == taint.value


def untolerated(pod: PodView, node: NodeView) -> Taint | None:
    """The first NoSchedule/NoExecute taint of `node` that `pod` does not tolerate."""
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in pod.tolerations):
            return taint
    return None


def _matches(req: Requirement, node: NodeView) -> bool:
    if req.field:  # matchFields: metadata.name only
        value: str | None = node.name if req.key == "metadata.name" else None
    else:
        value = dict(node.labels).get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            a, b = int(value), int(req.values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def affinity_matches(pod: PodView, node: NodeView) -> bool:
    """Required node affinity: some term whose every requirement holds (an empty term matches nothing)."""
    if not pod.affinity:
        return True
    return any(term and all(_matches(r, node) for r in term) for term in pod.affinity)


def short_of(pod: PodView, node: NodeView, usage: NodeUsage) -> list[str]:
    """The resources `pod` requests more of than `node` has left (kubelet's OutOf<resource>)."""
    alloc, used = node.allocatable_map, usage.request_map
    return sorted(res for res, want in pod.requests
                  if res != PODS and used.get(res, 0) + want > alloc.get(res, 0))


def reasons(pod: PodView, node: NodeView, usage: NodeUsage, job: str = "") -> list[str]:
    """Why `pod` may not run on `node` given what `usage` already holds there (empty: it may); `job`: the
    pod's job as `usage` names jobs (default: its label)."""
    out: list[str] = []
    if not node.ready:
        out.append(NOT_READY)
    if node.unschedulable and not any(tolerates(t, _CORDON) for t in pod.tolerations):
        out.append(UNSCHEDULABLE)
    taint = untolerated(pod, node)
    if taint is not None:
        out.append(f"node(s) had taint {{{taint.key}: {taint.value}}}, that the pod didn't tolerate")
    labels = dict(node.labels)
    if any(labels.get(k) != v for k, v in pod.node_selector) or not affinity_matches(pod, node):
        out.append(SELECTOR)
    if any(mine.conflicts(theirs) for mine in pod.host_ports for theirs in usage.ports):
        out.append(PORTS)
    out.extend(INSUFFICIENT + res for res in short_of(pod, node, usage))
    if usage.pods + 1 > node.allocatable_pods:
        out.append(TOO_MANY_PODS)
    if (job or pod.job) not in usage.jobs and len(usage.jobs) >= node.replicas:
        out.append(REPLICAS)
    return out


def fit_message(total_nodes: int, failures: Iterable[str]) -> str:
    """kube-scheduler's form: ``0/<N> nodes are available: <count> <reason>, ...`` (sorted)."""
    if total_nodes == 0:
        return "0/0 nodes are available: no nodes available to schedule pods"
    counts = Counter(failures)
    return f"0/{total_nodes} nodes are available: " + ", ".join(sorted(f"{n} {r}" for r, n in counts.items())) + "."
