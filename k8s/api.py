"""Contracts of the RollMux Kubernetes scheduler: the names it reads, the views it decides on, its decisions.

The scheduler is a secondary Kubernetes scheduler (pods opt in with ``spec.schedulerName``). Its pure
core (`gang`, `spec`, `nodefilter`, `assign`) turns plain views of pods and nodes into a
`GangDecision`; the edge (`kube`, `scheduler`) reads the API server, asks the coordinator, and binds.

Pod metadata a job's pods carry (documented once, here; docs/how-to/kubernetes-scheduler.md shows them):

=============================  =====  ======================================================================
name                           kind   meaning
=============================  =====  ======================================================================
``rollmux.io/job``             label  the job's name at the coordinator (the same on every pod of the gang)
``rollmux.io/pool``            label  ``rollout`` or ``train``: the pool this pod runs in (label or
                                      nodeSelector); pods without it are split between the pools
                                      by the GPU counts below, in name order
``rollmux.io/gang-size``       ann.   pods in the gang (else the owner's: a Job's parallelism, a RayCluster's
                                      head + workers)
``rollmux.io/rollout-gpus``    ann.   N_R (else the sum of the rollout pods' ``nvidia.com/gpu`` requests)
``rollmux.io/train-gpus``      ann.   N_T (else the sum of the training pods' requests)
``rollmux.io/slo``             ann.   SLO factor (>= 1)
``rollmux.io/t-roll-s``        ann.   measured worst-case solo rollout seconds
``rollmux.io/t-train-s``       ann.   measured worst-case solo train (+ sync) seconds
``rollmux.io/model-params-b``  ann.   model size, billions of parameters
``rollmux.io/max-tokens``      ann.   max response tokens
``rollmux.io/deployment``      ann.   fixed deployment mode (``disaggregated``, ``colocated-train``,
                                      ``colocated-rollout``)
=============================  =====  ======================================================================

A missing annotation gets the profiler's conservative default; the pods' event says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rollmux.core.errors import RollMuxError
from rollmux.core.model import Pool

SCHEDULER_NAME = "rollmux-scheduler"
"""The default ``spec.schedulerName`` of the pods this scheduler owns."""

PREFIX = "rollmux.io/"
JOB_LABEL = PREFIX + "job"
POOL_LABEL = PREFIX + "pool"
GANG_SIZE = PREFIX + "gang-size"
ROLLOUT_GPUS = PREFIX + "rollout-gpus"
TRAIN_GPUS = PREFIX + "train-gpus"
SLO = PREFIX + "slo"
T_ROLL_S = PREFIX + "t-roll-s"
T_TRAIN_S = PREFIX + "t-train-s"
MODEL_PARAMS_B = PREFIX + "model-params-b"
MAX_TOKENS = PREFIX + "max-tokens"
DEPLOYMENT = PREFIX + "deployment"
CONDITION_TYPE = "PodScheduled"
"""The pod condition the scheduler explains itself in (as kube-scheduler does)."""

GPU_RESOURCE = "nvidia.com/gpu"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
"""GPU feature discovery's label: time-slicing replicas per physical GPU (a node hosts at most as many jobs)."""


class Code(str, Enum):
    """Why a gang is not bound now (stable values: they name events and metric labels)."""

    INCOMPLETE = "incomplete"  # fewer pending pods than the gang size: wait for the rest
    BAD_INPUT = "bad-input"  # a label or annotation that does not parse or disagrees: fix the pods
    REFUSED = "refused"  # the coordinator refused the job (it can never fit): fix the spec
    QUEUED = "queued"  # the coordinator holds the job in its admission queue
    UNSCHEDULABLE = "unschedulable"  # placed, but a node fails what kube-scheduler would check
    COORDINATOR = "coordinator-unavailable"  # the coordinator cannot be reached now: retried


class SchedulerError(RollMuxError):
    """A pod or gang the scheduler cannot act on; `code` says why, the message what to fix."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.reason = code


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with operator Exists: tolerates every taint
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty: every effect


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """The controller owning a pod (``metadata.ownerReferences[controller=true]``)."""

    kind: str  # Job | RayCluster | ...
    name: str
    api_version: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """What the scheduler reads of one pod."""

    namespace: str
    name: str
    uid: str
    scheduler_name: str
    node_name: str = ""  # "" while pending
    phase: str = "Pending"  # status.phase
    deleting: bool = False  # metadata.deletionTimestamp set
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    gpus: int = 0  # nvidia.com/gpu requested (an integer extended resource)
    owner: Owner | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def annotation_map(self) -> dict[str, str]:
        return dict(self.annotations)

    @property
    def job(self) -> str:
        return self.label_map.get(JOB_LABEL, "")

    @property
    def pool(self) -> Pool | None:
        """The pool the pod asks for (label, else nodeSelector); None: the scheduler splits."""
        raw = self.label_map.get(POOL_LABEL) or dict(self.node_selector).get(POOL_LABEL)
        return Pool(raw) if raw in (Pool.ROLLOUT.value, Pool.TRAIN.value) else None

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """What the scheduler reads of one node."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    ready: bool = False  # condition Ready is True
    unschedulable: bool = False  # cordoned
    taints: tuple[Taint, ...] = ()
    allocatable_gpus: int = 0  # status.allocatable nvidia.com/gpu (GPUs x time-slicing replicas)
    allocatable_pods: int = 110

    @property
    def replicas(self) -> int:
        """Time-slicing replicas per GPU (1 without time-slicing)."""
        raw = dict(self.labels).get(REPLICAS_LABEL, "1")
        return int(raw) if raw.isdigit() and int(raw) > 0 else 1

    @property
    def physical_gpus(self) -> int:
        return self.allocatable_gpus // self.replicas

    @property
    def pool(self) -> Pool | None:
        raw = dict(self.labels).get(POOL_LABEL)
        return Pool(raw) if raw in (Pool.ROLLOUT.value, Pool.TRAIN.value) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUsage:
    """What pods already bound (by any scheduler) take of one node."""

    gpus: int = 0  # nvidia.com/gpu requested by its non-terminal pods
    pods: int = 0
    jobs: frozenset[str] = frozenset()  # rollmux jobs with a pod on it


@dataclass(frozen=True, slots=True, kw_only=True)
class Gang:
    """The pending pods of one job, complete or not."""

    namespace: str
    job: str  # the rollmux.io/job label
    pods: tuple[PodView, ...]  # pending, sorted by name
    size: int  # pods the gang needs (annotation or owner)

    @property
    def complete(self) -> bool:
        return len(self.pods) >= self.size


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    pod: PodView
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GangDecision:
    """What to do with one gang now: bind every pod (all or nothing), or wait and say why."""

    job: str
    bindings: tuple[Binding, ...] = ()  # empty: wait
    code: Code | None = None  # why it waits (None when bound)
    message: str = ""  # the explanation the pods' event and condition carry
    defaults: tuple[str, ...] = field(default=())  # spec fields that got the profiler's default

    @property
    def bound(self) -> bool:
        return bool(self.bindings)
