"""What bound pods take of each node: every requested resource, the pod count, host ports, and the jobs
there (time-slicing's cap). Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rollmux.k8s.api import NodeUsage, NodeView, PodView


def usage(pods: list[PodView], nodes: dict[str, NodeView], job_of: Callable[[PodView], str] = lambda p: p.job
          ) -> dict[str, NodeUsage]:
    """What bound, non-terminal pods (any scheduler) take of each node (`job_of`: a pod's job name, "" none).
    Sums into plain dicts first: one NodeUsage per node, not one per pod (thousands of pods every cycle)."""
    gpus: dict[str, int] = {}
    count: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    requests: dict[str, dict[str, int]] = {}
    ports: dict[str, list] = {}
    for pod in pods:
        node = pod.node_name
        if not node or pod.terminal:
            continue
        gpus[node] = gpus.get(node, 0) + pod.gpus
        count[node] = count.get(node, 0) + 1
        job = job_of(pod)
        if job:
            jobs.setdefault(node, set()).add(job)
        acc = requests.setdefault(node, {})
        for res, v in pod.requests:
            acc[res] = acc.get(res, 0) + v
        if pod.host_ports:
            ports.setdefault(node, []).extend(pod.host_ports)
    empty = NodeUsage()
    out = {n: empty for n in nodes}
    for node in count:
        out[node] = NodeUsage(gpus=gpus[node], pods=count[node], jobs=frozenset(jobs.get(node, ())),
                              requests=tuple(sorted(requests[node].items())), ports=tuple(ports.get(node, ())))
    return out


def add_pod(used: NodeUsage, pod: PodView, job: str = "") -> NodeUsage:
    """`used` with `pod` (of `job`, "" none) bound there too."""
    requests = used.request_map
    for res, v in pod.requests:
        requests[res] = requests.get(res, 0) + v
    return replace(used, gpus=used.gpus + pod.gpus, pods=used.pods + 1, jobs=used.jobs | {job} if job else used.jobs,
                   requests=tuple(sorted(requests.items())), ports=used.ports + pod.host_ports)
