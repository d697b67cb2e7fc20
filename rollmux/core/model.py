"""The domain model shared by every part of RollMux: GPU catalog, nodes, job specs, groups.

Everything here is plain, immutable data validated on construction. The scheduling policy, the
simulator and the coordinator all speak these types; protobuf and CSV stay at the edges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from rollmux.core.errors import SpecError

GB = 10**9
"""Bytes in a (decimal) gigabyte, the unit the paper's Table 2 uses."""

TB = 10**12


class Pool(str, Enum):
    """The two GPU pools a cluster pair offers."""

    ROLLOUT = "rollout"  # inference GPUs (e.g. H20): memory-bandwidth bound generation
    TRAIN = "train"  # training GPUs (e.g. H800): compute-bound optimisation


class Phase(str, Enum):
    """Phases of one RL iteration, in on-policy order: Rollout(i) -> Train(i) -> Sync(i)."""

    ROLLOUT = "rollout"
    TRAIN = "train"
    SYNC = "sync"


PHASE_ORDER: tuple[Phase, ...] = (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC)
"""On-policy order inside one iteration: Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1).

The one spelling of the order: the coordinator, the sidecar, the shim, the adapters and the
checkers all read it from here (a `Phase` compares equal to its string value, so
``"train" in PHASE_ORDER`` and ``PHASE_ORDER.index("train")`` work on names too)."""


def next_phase(phase: Phase | str, iteration: int) -> tuple[Phase, int]:
    """The phase that follows `phase` of `iteration` in on-policy order."""
    i = PHASE_ORDER.index(Phase(phase))
    if i + 1 == len(PHASE_ORDER):
        return PHASE_ORDER[0], iteration + 1
    return PHASE_ORDER[i + 1], iteration


def phase_key(phase: Phase | str, iteration: int) -> tuple[int, int]:
    """Where (`phase`, `iteration`) falls in on-policy order: compare two keys to tell which comes first.

    Raises:
        ValueError: `phase` is not a phase name.
    """
    return iteration, PHASE_ORDER.index(Phase(phase))


# Sane ranges for every number of a job spec: wider than any real job, narrow enough that the
# profiler and the policy never see an overflow or a value that poisons placement.
MAX_JOB_GPUS = 1 << 16
"""Most GPUs one job may ask for in one pool."""
MAX_SLO = 10.0
"""Largest SLO factor (a job may run at most 10x slower than alone)."""
MAX_PARAMS_B = 10_000.0
"""Largest model, billions of parameters."""
MAX_TOKENS = 1 << 21
"""Longest response, tokens per turn."""
MAX_BATCH = 1 << 20
"""Largest batch, prompts x samples per iteration."""
MAX_TURNS = 1024
"""Most turns per rollout."""
MAX_PHASE_S = 86_400.0
"""Longest phase time, seconds (a day)."""
MAX_STATE_BYTES = 1 << 50
"""Largest resident state per node, bytes (1 PiB)."""


class Deployment(str, Enum):
    """How one job's phases are laid out on the pools (the placement decision says which, and why).

    The coordinator chooses per job unless the job fixes it (`JobSpec.deployment`); adapters read
    the chosen mode at registration and build their workers to match.
    """

    DISAGGREGATED = "disaggregated"  # rollout on rollout-pool GPUs, training on training-pool GPUs (a group member)
    COLOCATED_TRAIN = "colocated-train"  # every phase on training-pool GPUs (alone or time-shared in a group)
    COLOCATED_ROLLOUT = "colocated-rollout"  # every phase on rollout-pool GPUs (where the training state fits)


def _require(cond: bool, field_name: str, value: Any, allowed: str) -> None:
    """Raise a SpecError naming the field, the bad value and the allowed range."""
    if not cond:
        raise SpecError(f"{field_name}={value!r} is invalid: expected {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any, name: str, *, integer: bool = False, high: float | None = None) -> None:
    at_most = "" if high is None else f" <= {high:g}"
    if integer:
        _require(isinstance(value, int) and not isinstance(value, bool) and value > 0
                 and (high is None or value <= high), name, value, f"a positive integer{at_most}")
    else:
        _require(_is_number(value) and value > 0 and (high is None or value <= high), name, value,
                 f"a positive finite number{at_most}")


def _non_negative(value: Any, name: str) -> None:
    _require(_is_number(value) and value >= 0, name, value, "a finite number >= 0")


# ----------------------------------------------------------------------------------------------
# GPU catalog
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuType:
    """One GPU model and what it costs."""

    name: str  # catalog key, e.g. "H20"
    tflops: float  # dense BF16/FP16 TFLOPS
    hbm_gb: float  # device memory, GB
    hbm_tb_s: float  # device memory bandwidth, TB/s
    usd_per_gpu_h: float  # rental price, $ per GPU-hour

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(self.name), "gpu.name", self.name, "a non-empty string")
        for attr in ("tflops", "hbm_gb", "hbm_tb_s", "usd_per_gpu_h"):
            _positive(getattr(self, attr), f"gpu[{self.name}].{attr}")


# Paper Table 1 for H20 and H800. The others are public spec-sheet figures (dense BF16) with
# indicative on-demand cloud list prices as of 2025; override them with a YAML file for your fleet.
DEFAULT_GPUS: tuple[GpuType, ...] = (
    GpuType(name="H20", tflops=148.0, hbm_gb=96.0, hbm_tb_s=4.0, usd_per_gpu_h=1.85),
    GpuType(name="H800", tflops=989.5, hbm_gb=80.0, hbm_tb_s=3.35, usd_per_gpu_h=5.28),
    GpuType(name="H100", tflops=989.5, hbm_gb=80.0, hbm_tb_s=3.35, usd_per_gpu_h=4.50),  # list price
    GpuType(name="H200", tflops=989.5, hbm_gb=141.0, hbm_tb_s=4.8, usd_per_gpu_h=5.00),  # list price
    GpuType(name="A100", tflops=312.0, hbm_gb=80.0, hbm_tb_s=2.0, usd_per_gpu_h=2.50),  # list price
    GpuType(name="L40S", tflops=362.0, hbm_gb=48.0, hbm_tb_s=0.864, usd_per_gpu_h=1.20),  # list price
)


@dataclass(frozen=True, slots=True)
class GpuCatalog:
    """GPU types by name. Defaults from the paper's Table 1, overridable from YAML."""

    gpus: Mapping[str, GpuType]

    @classmethod
    def default(cls) -> GpuCatalog:
        return cls({g.name: g for g in DEFAULT_GPUS})

    def __getitem__(self, name: str) -> GpuType:
        try:
            return self.gpus[name]
        except KeyError:
            raise SpecError(
                f"gpu_type={name!r} is not in the GPU catalog: expected one of {sorted(self.gpus)} "
                "(add it with a catalog YAML file)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.gpus

    def with_overrides(self, entries: Mapping[str, Mapping[str, Any]]) -> GpuCatalog:
        """A catalog where `entries` (name -> fields) replace or extend the current types."""
        merged = dict(self.gpus)
        for name, fields in entries.items():
            if not isinstance(fields, Mapping):
                raise SpecError(f"gpu catalog entry {name!r}={fields!r} is invalid: expected a mapping")
            base = merged.get(name)
            values: dict[str, Any] = {"tflops": None, "hbm_gb": None, "hbm_tb_s": None, "usd_per_gpu_h": None}
            if base is not None:
                values.update(tflops=base.tflops, hbm_gb=base.hbm_gb, hbm_tb_s=base.hbm_tb_s,
                              usd_per_gpu_h=base.usd_per_gpu_h)
            unknown = set(fields) - set(values)
            if unknown:
                raise SpecError(f"gpu catalog entry {name!r} has unknown fields {sorted(unknown)}: "
                                f"expected {sorted(values)}")
            values.update(fields)
            merged[name] = GpuType(name=name, **values)  # type: ignore[arg-type]
        return GpuCatalog(merged)

    @classmethod
    def from_yaml(cls, path: str | Path) -> GpuCatalog:
        """Defaults overridden by a YAML mapping `{gpus: {NAME: {tflops, hbm_gb, hbm_tb_s, usd_per_gpu_h}}}`."""
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, Mapping) or not isinstance(data.get("gpus", {}), Mapping):
            raise SpecError(f"{path}: expected a mapping with a 'gpus' mapping at top level")
        return cls.default().with_overrides(data.get("gpus", {}))


# ----------------------------------------------------------------------------------------------
# Cluster layout
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The shape of new nodes in each pool: what the policy provisions when it scales."""

    rollout_gpu: str = "H20"  # GPU type of the rollout pool
    train_gpu: str = "H800"  # GPU type of the training pool
    gpus_per_node: int = 8  # GPUs per node, both pools
    host_dram_bytes: int = 2 * TB  # host DRAM per node (warm-start cache lives here)
    catalog: GpuCatalog = field(default_factory=GpuCatalog.default)

    def __post_init__(self) -> None:
        _positive(self.gpus_per_node, "cluster.gpus_per_node", integer=True)
        _positive(self.host_dram_bytes, "cluster.host_dram_bytes", integer=True)
        self.catalog[self.rollout_gpu]  # noqa: B018  (validates the name)
        self.catalog[self.train_gpu]  # noqa: B018

    def gpu_for(self, pool: Pool) -> GpuType:
        return self.catalog[self.rollout_gpu if pool is Pool.ROLLOUT else self.train_gpu]

    def node_usd_per_h(self, pool: Pool) -> float:
        """Price of one whole node of `pool`."""
        return self.gpus_per_node * self.gpu_for(pool).usd_per_gpu_h

    def nodes_for(self, gpus: int) -> int:
        """Whole nodes needed to host `gpus` GPUs."""
        return -(-gpus // self.gpus_per_node)


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A physical (or simulated) node of one pool."""

    node_id: str  # unique across the cluster
    pool: Pool
    gpu_type: str  # key into the GPU catalog
    gpu_count: int = 8
    host_dram_bytes: int = 2 * TB  # host memory available for cached job state

    def __post_init__(self) -> None:
        _require(isinstance(self.node_id, str) and bool(self.node_id), "node.node_id", self.node_id,
                 "a non-empty string")
        _require(isinstance(self.pool, Pool), "node.pool", self.pool, "Pool.ROLLOUT or Pool.TRAIN")
        _positive(self.gpu_count, f"node[{self.node_id}].gpu_count", integer=True)
        _positive(self.host_dram_bytes, f"node[{self.node_id}].host_dram_bytes", integer=True)


# ----------------------------------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What a user submits: one synchronous on-policy RL job.

    Phase times are *worst-case solo* times (every response at max tokens) on the job's own
    N_R rollout and N_T training GPUs; the profiler fills them when they are not given.
    """

    name: str  # unique job name
    n_rollout_gpus: int  # N_R
    n_train_gpus: int  # N_T
    slo: float = 1.2  # max slowdown vs solo, >= 1 (1.2 = at most 20% slower)
    model_params_b: float = 7.0  # model size, billions of parameters
    max_tokens: int = 8192  # max response tokens (per turn)
    batch_size: int = 256  # prompts x samples per iteration
    turns: int = 1  # 1 = single-turn; > 1 = multi-turn agentic
    rollout_state_bytes: int | None = None  # resident host state per rollout node (None: Table 2 default)
    train_state_bytes: int | None = None  # resident host state per training node (None: Table 2 default)
    t_roll_s: float | None = None  # worst-case solo rollout time, s (None: profiler estimate)
    t_train_s: float | None = None  # worst-case solo train time incl. sync, s (None: profiler estimate)
    deployment: Deployment | None = None  # fixed deployment mode; None: the coordinator chooses the cheapest
    # Elastic training: its data parallelism may stretch over a group's whole training pool (pooled
    # groups, pool merges). False (veRL, ROLL: a fixed world size): it trains on its own N_T GPUs only.
    elastic: bool = False

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(self.name), "job.name", self.name, "a non-empty string")
        p = f"job[{self.name}]"
        if isinstance(self.deployment, str) and not isinstance(self.deployment, Deployment):
            modes = [d.value for d in Deployment]
            _require(self.deployment in modes, f"{p}.deployment", self.deployment, f"one of {modes} or None")
            object.__setattr__(self, "deployment", Deployment(self.deployment))
        _require(isinstance(self.elastic, bool), f"{p}.elastic", self.elastic, "true or false")
        _positive(self.n_rollout_gpus, f"{p}.n_rollout_gpus", integer=True, high=MAX_JOB_GPUS)
        _positive(self.n_train_gpus, f"{p}.n_train_gpus", integer=True, high=MAX_JOB_GPUS)
        _require(_is_number(self.slo) and 1.0 <= self.slo <= MAX_SLO, f"{p}.slo", self.slo,
                 f"a number >= 1.0 and <= {MAX_SLO:g}")
        _positive(self.model_params_b, f"{p}.model_params_b", high=MAX_PARAMS_B)
        _positive(self.max_tokens, f"{p}.max_tokens", integer=True, high=MAX_TOKENS)
        _positive(self.batch_size, f"{p}.batch_size", integer=True, high=MAX_BATCH)
        _positive(self.turns, f"{p}.turns", integer=True, high=MAX_TURNS)
        for attr in ("rollout_state_bytes", "train_state_bytes"):
            v = getattr(self, attr)
            if v is not None:
                _require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STATE_BYTES,
                         f"{p}.{attr}", v, f"an integer >= 0 and <= {MAX_STATE_BYTES} (bytes)")
        for attr in ("t_roll_s", "t_train_s"):
            v = getattr(self, attr)
            if v is not None:
                _positive(v, f"{p}.{attr}", high=MAX_PHASE_S)

    @property
    def has_times(self) -> bool:
        return self.t_roll_s is not None and self.t_train_s is not None

    @property
    def t_solo_s(self) -> float:
        """T_solo = T_roll + T_train (worst case, alone on its own GPUs)."""
        if self.t_roll_s is None or self.t_train_s is None:
            raise SpecError(f"job[{self.name}] has no phase times: resolve it with the profiler first")
        return self.t_roll_s + self.t_train_s

    def validate_for(self, cluster: ClusterSpec) -> None:
        """Check that this job can run at all on `cluster` (state fits a node's DRAM)."""
        for attr in ("rollout_state_bytes", "train_state_bytes"):
            v = getattr(self, attr)
            if v is not None and v > cluster.host_dram_bytes:
                raise SpecError(
                    f"job[{self.name}].{attr}={v} exceeds a node's host DRAM "
                    f"({cluster.host_dram_bytes} bytes): expected <= {cluster.host_dram_bytes}"
                )


# ----------------------------------------------------------------------------------------------
# Groups (read-only snapshot; the policy keeps its own incremental state)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one job of a group runs: its pinned rollout nodes (it trains on its own training nodes)."""

    job: str  # job name
    rollout_nodes: tuple[str, ...]  # node ids, in the group's rollout pool


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """A co-execution group: jobs time-sharing one rollout pool and one training pool."""

    group_id: str
    jobs: tuple[str, ...]  # job names in round-robin order (arrival order)
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    placements: tuple[Placement, ...]
    usd_per_h: float  # Cost(G): price of every GPU in the group


# ----------------------------------------------------------------------------------------------
# Run permits
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A granted run permit: one phase of a job holds `nodes` until it releases, fenced by `epoch`.

    The one permit type of every layer: the coordinator client returns it, the sidecar fans it out
    to a job's local ranks, the shim binds it to the running phase.
    """

    job: str
    phase: Phase
    iteration: int
    epoch: int  # fencing token; carry it on every renew, release and progress report
    nodes: tuple[str, ...]
    ttl_s: float  # renew well within this (the client's `hold` renews every ttl/4)


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """Long-tail migration: finish the rollout on `keep_nodes`, stop using `release_nodes`.

    The one migration type: the coordinator decides it (`policy.migration`), its client, the
    sidecar and the shim pass it on unchanged.
    """

    job: str
    epoch: int
    keep_nodes: tuple[str, ...]
    release_nodes: tuple[str, ...]


class RelocationState(str, Enum):
    """Where a relocation directive stands (coordinator/service/runtime/states.py has its transitions)."""

    PENDING = "pending"  # issued; the job has not switched yet
    SWITCHED = "switched"  # the job acknowledged at an iteration boundary: its membership moved
    EXPIRED = "expired"  # the deadline passed first: the job keeps its place
    CANCELLED = "cancelled"  # no longer worth it (or possible) when the job acknowledged, or the job left


@dataclass(frozen=True, slots=True, kw_only=True)
class Relocation:
    """Regrouping directive: at an iteration boundary, move `job` from `from_group` to `to_group`.

    The one relocation type: the coordinator decides it (`policy.regroup`), its client, the
    sidecar and the shim pass it on unchanged. `epoch` names the directive (the job acknowledges
    with it); once SWITCHED, `switched_epoch` is the fencing epoch of the new membership and
    `rollout_nodes` / `train_nodes` are the job's nodes in its new group.
    """

    job: str
    from_group: str
    to_group: str  # "" = a new group
    epoch: int
    deadline_unix_s: float  # wall time after which an unacknowledged directive expires
    state: RelocationState = RelocationState.PENDING
    rollout_nodes: tuple[str, ...] = ()
    train_nodes: tuple[str, ...] = ()
    switched_epoch: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Revocation:
    """A lease taken back before its phase released it (expired, revoked by an operator, the job
    removed or a rank of it died): the job's ranks must stop the phase of `epoch` at once."""

    job: str
    epoch: int  # the revoked lease; 0 = whatever the job holds (a rank died)
    reason: str = ""


# ----------------------------------------------------------------------------------------------
# Views: what the coordinator answers about jobs, nodes and groups (its status calls)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """One registered job as the coordinator sees it now."""

    job: str
    state: str  # JobState value: pending | admitted
    group_id: str
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    next_phase: Phase  # the phase to run next (or running)
    next_iteration: int
    permit_state: str  # PermitState value of that phase ("pending-admission" before it has one)
    pending_position: int  # 1-based place in the admission queue, 0 when admitted
    relocation: Relocation | None = None  # the job's latest relocation directive
    learned: tuple[float, float, float] = (0.0, 0.0, 0.0)  # learned solo (roll, train, iteration) s; 0 = none
    lease: Lease | None = None  # the lease its phase holds now, if granted
    observed_roll_s: float = 0.0  # moving average of measured rollout durations, s (0 = none yet)
    observed_train_s: float = 0.0  # moving average of measured train (+ sync) durations, s
    placement: str = ""  # the policy's explanation of its placement
    relayed_by: str = ""  # node whose sidecar relayed its registration ("" = registered directly)
    deployment: str = ""  # Deployment value its phases are laid out by ("" = not decided yet)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """One registered node as the coordinator sees it now."""

    node_id: str
    pool: Pool
    gpu_type: str
    gpu_count: int
    host_dram_bytes: int
    state: str  # NodeState value: ready | lost | draining | drained
    group_id: str = ""  # "" = in no group
    queue: tuple[str, ...] = ()  # job names waiting for the node, FIFO (head first)
    holder: Lease | None = None  # the permit holding the node now, if any
    connected: bool = False  # its sidecar's stream is open


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    """One co-execution group as the coordinator sees it now."""

    group_id: str
    jobs: tuple[str, ...]  # round-robin order
    rollout_nodes: tuple[str, ...]
    train_nodes: tuple[str, ...]
    usd_per_h: float  # Cost(G)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """The coordinator's whole state, for operators (``rollmux status``)."""

    ready: bool  # serving (leader, state loaded, store reachable)
    leader_fence: int  # the leader's fencing token
    pending: tuple[str, ...]  # jobs waiting for admission, in arrival order
    usd_per_h: float  # cost of every group
    nodes: tuple[NodeInfo, ...] = ()  # by pool, then id
    groups: tuple[GroupInfo, ...] = ()
    jobs: tuple[JobInfo, ...] = ()  # in arrival order


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSnapshot:
    """A node's state as its sidecar's stream opens (and on every change): who holds it now."""

    node_id: str
    state: str  # NodeState value
    holder: Lease | None = None


NodeEvent = NodeSnapshot | Lease | Revocation | Migration | Relocation
"""What the coordinator sends a node's sidecar on its stream: a snapshot, a granted lease, a
revocation, a long-tail migration or a relocation directive (issued, or its outcome)."""
