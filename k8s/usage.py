"""What bound pods take of each node: every requested resource, the pod count, host ports, and the jobs
there (time-slicing's cap). Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rollmux.k8s.api import NodeUsage, NodeView, PodView


def usage(pods: list[PodView], nodes: dict[str, NodeView], job_of: Callable[[PodView], str] = lambda p: p.job
          ) -> dict[str, NodeUsage]:
    """What bound, non-terminal pods (any scheduler) take of each node (`job_of`: a pod's job name, "" none)."""
    out = {n: NodeUsage() for n in nodes}
    for pod in pods:
        if pod.node_name and not pod.terminal:
            out[pod.node_name] = add_pod(out.get(pod.node_name, NodeUsage()), pod, job_of(pod))
    return out


def add_pod(used: NodeUsage, pod: PodView, job: str = "") -> NodeUsage:
    """`used` with `pod` (of `job`, "" none) bound there too."""
    requests = used.request_map
    for res, v in pod.requests:
        requests[res] = requests.get(res, 0) + v
    return replace(used, gpus=used.gpus + pod.gpus, pods=used.pods + 1, jobs=used.jobs | {job} if job else used.jobs,
                   requests=tuple(sorted(requests.items())), ports=used.ports + pod.host_ports)
