"""Contracts of the RollMux Kubernetes scheduler: the names it reads, the views it decides on, its decisions.

The scheduler is a secondary Kubernetes scheduler (pods opt in with ``spec.schedulerName``). Its pure
core (`gang`, `spec`, `nodefilter`, `assign`) turns plain views of pods and nodes into a
`GangDecision`; the edge (`kube`, `scheduler`) reads the API server, asks the coordinator, and binds.

Pod metadata a job's pods carry (documented once, here; docs/how-to/kubernetes-scheduler.md shows them):

=============================  =====  ======================================================================
name                           kind   meaning
=============================  =====  ======================================================================
``rollmux.io/job``             label  the job's name in its namespace (the same on every pod of the gang); at
                                      the coordinator it is ``<namespace>.<job>``
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
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""The pod label naming its ``scheduling.x-k8s.io/v1alpha1`` PodGroup (coscheduling, KubeRay's batch-scheduler)."""
CONDITION_TYPE = "PodScheduled"
"""The pod condition the scheduler explains itself in (as kube-scheduler does)."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The default GPU resource name (``nvidia.com/gpu.shared`` where time-slicing sets ``renameByDefault``)."""
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
"""GPU feature discovery's label: time-slicing replicas per physical GPU (a node hosts at most as many jobs)."""
PODS = "pods"
"""The node resource counting pods (every pod takes one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Conventions:
    """The cluster's names for GPUs and pools (chart values; the same for every pod and node)."""

    gpu_resource: str = GPU_RESOURCE  # the extended resource a pod's GPUs are requested as
    pool_label: str = POOL_LABEL  # the node label (and a pod's nodeSelector key) naming its pool
    replicas_label: str = REPLICAS_LABEL  # time-slicing replicas per physical GPU on a node

    def qualified(self, namespace: str, job: str) -> str:
        """A job's name at the coordinator: ``<namespace>.<job>`` (a namespace has no dot, so it never clashes)."""
        return f"{namespace}.{job}"


class Code(str, Enum):
    """Why a gang is not bound now (stable values: they name events and metric labels)."""

    INCOMPLETE = "incomplete"  # fewer pending pods than the gang size: wait for the rest
    BAD_INPUT = "bad-input"  # a label or annotation that does not parse or disagrees: fix the pods
    REFUSED = "refused"  # the coordinator refused the job (it can never fit): fix the spec
    QUEUED = "queued"  # the coordinator holds the job in its admission queue
    UNSCHEDULABLE = "unschedulable"  # placed, but a node fails what kube-scheduler would check
    COORDINATOR = "coordinator-unavailable"  # the coordinator cannot be reached now: retried
    MISMATCH = "registration-mismatch"  # the job's registration was made for another shape of gang
    GATED = "gated"  # a pod carries scheduling gates (e.g. Kueue holds it): not looked at until lifted
    BIND_FAILED = "bind-failed"  # the API server refused a Binding: retried until whole or the gang timeout
    TIMEOUT = "gang-timeout"  # not whole within the gang timeout: its bound pods are evicted


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


@dataclass(frozen=True, slots=True)
class HostPort:
    port: int
    protocol: str = "TCP"
    ip: str = ""  # "" or 0.0.0.0: every address

    def conflicts(self, other: HostPort) -> bool:
        """kubelet's rule: the same port and protocol on the same address, or either on every address."""
        wild = ("", "0.0.0.0")
        return (self.port == other.port and self.protocol == other.protocol
                and (self.ip in wild or other.ip in wild or self.ip == other.ip))


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node selector requirement (``matchExpressions``, or ``matchFields`` on metadata.name)."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    field: bool = False  # a matchFields requirement


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
    gpus: int = 0  # the GPU resource requested (an integer extended resource)
    requests: tuple[tuple[str, int], ...] = ()  # resource -> milli-units (pod overhead included; "pods" not)
    host_ports: tuple[HostPort, ...] = ()
    affinity: tuple[tuple[Requirement, ...], ...] = ()  # required node affinity: any term, each all of
    priority: int = 0  # spec.priority
    created: str = ""  # metadata.creationTimestamp (RFC 3339: sorts as time)
    gates: tuple[str, ...] = ()  # spec.schedulingGates names
    pool: Pool | None = None  # the pool the pod asks for (label, else nodeSelector); None: the scheduler splits
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
        """The job's name in its namespace: the rollmux.io/job label, else its PodGroup's name."""
        labels = self.label_map
        return labels.get(JOB_LABEL) or labels.get(POD_GROUP_LABEL, "")

    @property
    def request_map(self) -> dict[str, int]:
        return dict(self.requests)

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
    allocatable: tuple[tuple[str, int], ...] = ()  # resource -> milli-units (status.allocatable)
    allocatable_gpus: int = 0  # the GPU resource allocatable (GPUs x time-slicing replicas)
    allocatable_pods: int = 110
    replicas: int = 1  # time-slicing replicas per GPU (1 without time-slicing)
    pool: Pool | None = None  # the pool its pool label names

    @property
    def allocatable_map(self) -> dict[str, int]:
        return dict(self.allocatable)

    @property
    def physical_gpus(self) -> int:
        return self.allocatable_gpus // self.replicas


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUsage:
    """What pods already bound (by any scheduler) take of one node."""

    gpus: int = 0  # the GPU resource requested by its non-terminal pods
    pods: int = 0
    jobs: frozenset[str] = frozenset()  # rollmux jobs (qualified names) with a pod on it
    requests: tuple[tuple[str, int], ...] = ()  # resource -> milli-units its pods request
    ports: tuple[HostPort, ...] = ()  # host ports its pods hold

    @property
    def request_map(self) -> dict[str, int]:
        return dict(self.requests)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gang:
    """The pending pods of one job, complete or not."""

    namespace: str
    job: str  # the rollmux.io/job label
    pods: tuple[PodView, ...]  # pending (and bound siblings), sorted by name
    size: int  # pods the gang needs (PodGroup minMember, annotation or owner)
    name: str = ""  # the job's name at the coordinator (`Conventions.qualified`); "" means `job`

    @property
    def qualified(self) -> str:
        return self.name or self.job

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
