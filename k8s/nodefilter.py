"""What kube-scheduler would check before a pod runs on a node, for the nodes the policy chose.

Pure, one small rule per reason (the reason strings are kube-scheduler 1.20's, so `kubectl describe`
reads the same as for its own pods): Ready, not cordoned, taints tolerated, node selector, GPU and
pod capacity, and time-slicing: a node hosts at most as many jobs as its GPUs have replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rollmux.k8s.api import NodeUsage, NodeView, PodView, Taint, Toleration

NOT_READY = "node(s) were not ready"
UNSCHEDULABLE = "node(s) were unschedulable"
SELECTOR = "node(s) didn't match node selector"
INSUFFICIENT_GPU = "Insufficient nvidia.com/gpu"
TOO_MANY_PODS = "Too many pods"
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


def reasons(pod: PodView, node: NodeView, usage: NodeUsage) -> list[str]:
    """Why `pod` may not run on `node` given what `usage` already holds there (empty: it may)."""
    out: list[str] = []
    if not node.ready:
        out.append(NOT_READY)
    if node.unschedulable and not any(tolerates(t, _CORDON) for t in pod.tolerations):
        out.append(UNSCHEDULABLE)
    taint = untolerated(pod, node)
    if taint is not None:
        out.append(f"node(s) had taint {{{taint.key}: {taint.value}}}, that the pod didn't tolerate")
    labels = dict(node.labels)
    if any(labels.get(k) != v for k, v in pod.node_selector):
        out.append(SELECTOR)
    if usage.gpus + pod.gpus > node.allocatable_gpus:
        out.append(INSUFFICIENT_GPU)
    if usage.pods + 1 > node.allocatable_pods:
        out.append(TOO_MANY_PODS)
    if pod.job not in usage.jobs and len(usage.jobs) >= node.replicas:
        out.append(REPLICAS)
    return out


def fit_message(total_nodes: int, failures: Iterable[str]) -> str:
    """kube-scheduler's form: ``0/<N> nodes are available: <count> <reason>, ...`` (sorted)."""
    if total_nodes == 0:
        return "0/0 nodes are available: no nodes available to schedule pods"
    counts = Counter(failures)
    return f"0/{total_nodes} nodes are available: " + ", ".join(sorted(f"{n} {r}" for r, n in counts.items())) + "."
