"""Which node each pod of a gang binds to, given the nodes the coordinator placed the job on.

Pure: a gang, its pools, the job's placement and the cluster's nodes and usage in, a `GangDecision`
out. All or nothing: every pending pod gets a node that passes `nodefilter`, with the whole gang's
requests reserved as it goes, or none does and the decision says why. Pods of the gang already bound
(a retried gang, a replaced pod) count where they are: in the node's usage and in the job's share of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rollmux.core.model import Pool
from rollmux.k8s import nodefilter
from rollmux.k8s.api import GPU_RESOURCE, PODS, Binding, Code, GangDecision, NodeUsage, NodeView, PodView
from rollmux.k8s.usage import add_pod


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A placed node Kubernetes refuses for every pod (cordoned, NotReady, a taint no pod tolerates)."""

    node: str
    reasons: tuple[str, ...]


def assign(job: str, pools: Sequence[tuple[PodView, Pool]], placed: Mapping[Pool, Sequence[str]],
           nodes: Mapping[str, NodeView], usage: Mapping[str, NodeUsage], *, explain: str,
           gpu_resource: str = GPU_RESOURCE) -> GangDecision:
    """Bind each pending pod to a node of its pool's placed nodes.

    Pods of one pool spread over that pool's nodes first (a job's ranks per node are its GPUs per
    node; two pods of the job on one node only when one node's GPUs hold them), in the placement's
    order. A pool the placement left empty (a co-located deployment) uses the other pool's nodes.

    Args:
        job: the job's name at the coordinator (as `usage` names jobs).
        pools: each pod of the gang (bound ones too) and its pool.
        placed: the coordinator's nodes per pool for the job.
        nodes: every node by name.
        usage: what bound pods (the gang's bound ones included) already take of each node.
        explain: the placement's description, leading the decision's message.
        gpu_resource: the GPU resource's name, for the message when a job outgrows a node's GPUs.
    """
    taken = dict(usage)
    mine: dict[str, int] = {}  # node -> GPUs this job holds there (bound siblings, then reserved)
    for pod, _ in pools:
        if pod.node_name:
            mine[pod.node_name] = mine.get(pod.node_name, 0) + pod.gpus
    bindings: list[Binding] = []
    for pod, pool in pools:
        if pod.node_name:
            continue
        candidates = list(placed.get(pool) or ()) or list(placed.get(_other(pool)) or ())
        failures: list[str] = []
        chosen = ""
        for name in sorted(candidates, key=lambda n: (mine.get(n, 0) > 0, candidates.index(n))):
            node = nodes.get(name)
            if node is None:
                failures.append(nodefilter.UNKNOWN)
                continue
            why = nodefilter.reasons(pod, node, taken.get(name, NodeUsage()), job)
            if not why and mine.get(name, 0) + pod.gpus > max(node.physical_gpus, 1):
                why = [nodefilter.INSUFFICIENT + gpu_resource]  # a job takes at most a node's physical GPUs
            if why:
                failures.extend(why)
                continue
            chosen = name
            break
        if not chosen:
            msg = nodefilter.fit_message(len(candidates), failures)
            return GangDecision(job=job, code=Code.UNSCHEDULABLE,
                                message=f"waiting: {explain}, but pod {pod.name} fits none of its "
                                        f"{pool.value} nodes ({', '.join(candidates) or 'none'}): {msg}")
        taken[chosen] = add_pod(taken.get(chosen, NodeUsage()), pod, job)  # reserve
        mine[chosen] = mine.get(chosen, 0) + pod.gpus
        bindings.append(Binding(pod=pod, node=chosen))
    return GangDecision(job=job, bindings=tuple(bindings), message=explain)


def refusals(pools: Sequence[tuple[PodView, Pool]], placed: Mapping[Pool, Sequence[str]],
             nodes: Mapping[str, NodeView]) -> list[Refusal]:
    """The placed nodes that no pending pod of the gang may run on whatever they hold: missing, not
    Ready, cordoned, or tainted against every pod (a capacity shortfall is not one: it frees up)."""
    pending = [p for p, _ in pools if not p.node_name]
    out = []
    for name in dict.fromkeys([*(placed.get(Pool.ROLLOUT) or ()), *(placed.get(Pool.TRAIN) or ())]):
        node = nodes.get(name)
        if node is None:
            out.append(Refusal(node=name, reasons=(nodefilter.UNKNOWN,)))
            continue
        per_pod = [set(nodefilter.reasons(p, node, NodeUsage())) for p in pending]
        fatal = [r for r in (per_pod[0] if per_pod else ()) if all(r in w for w in per_pod)
                 and (r in nodefilter.NODE_LEVEL or r.startswith("node(s) had taint"))]
        if fatal:
            out.append(Refusal(node=name, reasons=tuple(sorted(fatal))))
    return out


def _other(pool: Pool) -> Pool:
    return Pool.TRAIN if pool is Pool.ROLLOUT else Pool.ROLLOUT


def never_fits(pools: Sequence[tuple[PodView, Pool]], nodes: Mapping[str, NodeView],
               gpu_resource: str = GPU_RESOURCE) -> str:
    """Why some pod could not run on any node of its pool even on an empty cluster ("" if each could):
    more GPUs than the largest node's physical GPUs, or more of any resource than any node allocates."""
    for pod, pool in pools:
        mine = [n for n in nodes.values() if n.pool is pool]
        biggest = max((n.physical_gpus for n in mine), default=0)
        if pod.gpus > biggest:
            return (f"pod {pod.name} requests {pod.gpus} {gpu_resource} but the largest {pool.value} node has "
                    f"{biggest} GPUs: it can never fit; ask for at most {biggest} per pod and more pods")
        for res, want in pod.requests:
            if res in (gpu_resource, PODS):
                continue
            most = max((n.allocatable_map.get(res, 0) for n in mine), default=0)
            if want > most:
                return (f"pod {pod.name} requests {_fmt(res, want)} {res} but the largest {pool.value} node "
                        f"allocates {_fmt(res, most)}: it can never fit; ask for less")
    return ""


def _fmt(res: str, value: int) -> str:
    """Milli-units as a person writes them: CPU in cores (or m), memory and storage in Gi/Mi, else whole."""
    if res == "cpu":
        return f"{value}m" if value % 1000 else str(value // 1000)
    units = value // 1000
    if res in ("memory", "ephemeral-storage") or res.startswith("hugepages-"):
        for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if units >= size:
                return f"{units / size:g}{suffix}"
    return str(units)
