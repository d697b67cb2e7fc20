"""A job's spec from its gang's pod annotations and GPU requests, and which pool each pod runs in.

Pure. Annotations are documented once in `rollmux.k8s.api`. A field without an annotation is left
to the coordinator's profiler (its conservative default); the decision lists those fields so the
pods' event can say so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rollmux.core.errors import SpecError
from rollmux.core.model import Deployment, JobSpec, Pool
from rollmux.k8s.api import (
    DEPLOYMENT,
    MAX_TOKENS,
    MODEL_PARAMS_B,
    PREFIX,
    ROLLOUT_GPUS,
    SLO,
    T_ROLL_S,
    T_TRAIN_S,
    TRAIN_GPUS,
    Code,
    Gang,
    PodView,
    SchedulerError,
)

# annotation -> (JobSpec field, parser)
_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    SLO: ("slo", float),
    T_ROLL_S: ("t_roll_s", float),
    T_TRAIN_S: ("t_train_s", float),
    MODEL_PARAMS_B: ("model_params_b", float),
    MAX_TOKENS: ("max_tokens", int),
    DEPLOYMENT: ("deployment", Deployment),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GangSpec:
    """The job a gang asks for, and the pool of each of its pods."""

    spec: JobSpec
    pools: tuple[tuple[PodView, Pool], ...]  # every pod of the gang, in the gang's order
    defaults: tuple[str, ...]  # JobSpec fields left to the profiler's default


def _annotations(gang: Gang) -> dict[str, str]:
    """The gang's rollmux.io/* annotations, which every pod must carry alike."""
    seen = {tuple(sorted((k, v) for k, v in p.annotations if k.startswith(PREFIX))) for p in gang.pods}
    if len(seen) > 1:
        raise SchedulerError(Code.BAD_INPUT, f"pods of job {gang.job!r} carry different {PREFIX}* annotations: "
                                             "give every pod of the job the same ones")
    return dict(seen.pop()) if seen else {}


def _gpu_count(ann: dict[str, str], key: str) -> int | None:
    if key not in ann:
        return None
    if not ann[key].isdigit():
        raise SchedulerError(Code.BAD_INPUT, f"{key}={ann[key]!r} on job: expected a whole number")
    return int(ann[key])


def split_pools(gang: Gang, n_rollout: int | None,
                node_pools: Mapping[str, Pool | None] | None = None) -> tuple[tuple[PodView, Pool], ...]:
    """Each pod's pool: its own where it names one, its node's where it is bound already (`node_pools`:
    node name -> pool); the other pods fill rollout up to N_R, then training, in gang order. A pod without
    GPUs (a Ray head, the job's driver) without a pool goes with training.

    A bound pod keeps its node's pool so that a gang whose pods are replaced one by one (a Job's controller
    after exit 75) gives each replacement the role of the pod it replaces, whatever the names sort as."""
    node_pools = node_pools or {}

    def own(pod: PodView) -> Pool | None:
        return pod.pool or (node_pools.get(pod.node_name) if pod.node_name else None)

    fixed = sum(p.gpus for p in gang.pods if own(p) is Pool.ROLLOUT)
    room = (n_rollout if n_rollout is not None else fixed) - fixed
    out = []
    for pod in gang.pods:
        pool = own(pod)
        if pool is None:
            pool = Pool.ROLLOUT if 0 < pod.gpus <= room else Pool.TRAIN
            if pool is Pool.ROLLOUT:
                room -= pod.gpus
        out.append((pod, pool))
    return tuple(out)


_COLOCATED = {Deployment.COLOCATED_TRAIN.value: Pool.TRAIN, Deployment.COLOCATED_ROLLOUT.value: Pool.ROLLOUT}


def gang_spec(gang: Gang, node_pools: Mapping[str, Pool | None] | None = None) -> GangSpec:
    """The job spec of a complete gang (`node_pools`: the pool of each node, for its bound pods).

    Raises:
        SchedulerError: BAD_INPUT, an annotation that does not parse or is out of range, pods that
            disagree, GPU counts the pods do not add up to, or a pod without GPUs.
    """
    ann = _annotations(gang)
    if not any(pod.gpus for pod in gang.pods):
        raise SchedulerError(Code.BAD_INPUT, f"no pod of job {gang.job!r} requests GPUs: a RollMux job "
                                             "runs on GPUs of its pools")
    n_rollout, n_train = _gpu_count(ann, ROLLOUT_GPUS), _gpu_count(ann, TRAIN_GPUS)
    colocated = _COLOCATED.get(ann.get(DEPLOYMENT, ""))
    if colocated is not None:  # every phase on one pool's GPUs: both phases use all of them
        pools = tuple((p, colocated) for p in gang.pods)
        total = sum(p.gpus for p in gang.pods)
        sums = want = {Pool.ROLLOUT: total, Pool.TRAIN: total}
    else:
        pools = split_pools(gang, n_rollout, node_pools)
        sums = {pool: sum(p.gpus for p, q in pools if q is pool) for pool in Pool}
        want = {Pool.ROLLOUT: n_rollout if n_rollout is not None else sums[Pool.ROLLOUT],
                Pool.TRAIN: n_train if n_train is not None else sums[Pool.TRAIN]}
    if want != sums:
        raise SchedulerError(Code.BAD_INPUT, f"job {gang.job!r}: its pods request {sums[Pool.ROLLOUT]} rollout and "
                                             f"{sums[Pool.TRAIN]} training GPUs, its annotations ask for "
                                             f"{want[Pool.ROLLOUT]} and {want[Pool.TRAIN]}")
    values: dict[str, Any] = {}
    for key, (field_name, parse) in _FIELDS.items():
        if key in ann:
            try:
                values[field_name] = parse(ann[key])
            except ValueError:
                raise SchedulerError(Code.BAD_INPUT, f"{key}={ann[key]!r} on job {gang.job!r} does not parse as "
                                                     f"{field_name}") from None
    try:
        spec = JobSpec(name=gang.qualified, n_rollout_gpus=sums[Pool.ROLLOUT], n_train_gpus=sums[Pool.TRAIN], **values)
    except SpecError as exc:
        raise SchedulerError(Code.BAD_INPUT, f"job {gang.job!r}: {exc}") from None
    defaults = tuple(name for name, _ in _FIELDS.values() if name not in values and name != "deployment")
    return GangSpec(spec=spec, pools=pools, defaults=defaults)
