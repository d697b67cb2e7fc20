"""Which node each pod of a gang binds to, given the nodes the coordinator placed the job on.

Pure: a gang, its pools, the job's placement and the cluster's nodes and usage in, a `GangDecision`
out. All or nothing: every pod gets a node that passes `nodefilter`, with the whole gang's
requests reserved as it goes, or none does and the decision says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from rollmux.core.model import Pool
from rollmux.k8s import nodefilter
from rollmux.k8s.api import Binding, Code, GangDecision, NodeUsage, NodeView, PodView


def assign(job: str, pools: Sequence[tuple[PodView, Pool]], placed: Mapping[Pool, Sequence[str]],
           nodes: Mapping[str, NodeView], usage: Mapping[str, NodeUsage], *, explain: str) -> GangDecision:
    """Bind each pod to a node of its pool's placed nodes.

    Pods of one pool spread over that pool's nodes first (a job's ranks per node are its GPUs per
    node; two pods of the job on one node only when one node's GPUs hold them), in the placement's
    order. A pool the placement left empty (a co-located deployment) uses the other pool's nodes.

    Args:
        job: the job's name.
        pools: each pod of the gang and its pool.
        placed: the coordinator's nodes per pool for the job.
        nodes: every node by name.
        usage: what bound pods already take of each node.
        explain: the placement's description, leading the decision's message.
    """
    taken = {name: usage.get(name, NodeUsage()) for name in nodes}
    mine: dict[str, int] = {}  # node -> GPUs this gang reserved there
    bindings: list[Binding] = []
    for pod, pool in pools:
        candidates = list(placed.get(pool) or ()) or list(placed.get(_other(pool)) or ())
        failures: list[str] = []
        chosen = ""
        for name in sorted(candidates, key=lambda n: (mine.get(n, 0) > 0, candidates.index(n))):
            node = nodes.get(name)
            if node is None:
                failures.append(nodefilter.UNKNOWN)
                continue
            why = nodefilter.reasons(pod, node, taken[name])
            if not why and mine.get(name, 0) + pod.gpus > max(node.physical_gpus, 1):
                why = [nodefilter.INSUFFICIENT_GPU]  # a job takes at most a node's physical GPUs
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
        u = taken[chosen]
        taken[chosen] = replace(u, gpus=u.gpus + pod.gpus, pods=u.pods + 1, jobs=u.jobs | {job})  # reserve
        mine[chosen] = mine.get(chosen, 0) + pod.gpus
        bindings.append(Binding(pod=pod, node=chosen))
    return GangDecision(job=job, bindings=tuple(bindings), message=explain)


def _other(pool: Pool) -> Pool:
    return Pool.TRAIN if pool is Pool.ROLLOUT else Pool.ROLLOUT


def never_fits(pools: Sequence[tuple[PodView, Pool]], nodes: Mapping[str, NodeView]) -> str:
    """Why some pod could not run on any node of its pool even on an empty cluster ("" if each could)."""
    for pod, pool in pools:
        biggest = max((n.physical_gpus for n in nodes.values() if n.pool is pool), default=0)
        if pod.gpus > biggest:
            return (f"pod {pod.name} requests {pod.gpus} nvidia.com/gpu but the largest {pool.value} node has "
                    f"{biggest} GPUs: it can never fit; ask for at most {biggest} per pod and more pods")
    return ""
