"""Mutable runtime records and their stored form.

Each record is a small class guarding its own fields; the runtime changes lifecycle states only
through `states.transition`. Records serialise to compact JSON under one key each:

| key               | record                                                       |
|-------------------|--------------------------------------------------------------|
| ``meta``          | counters: last epoch, arrival sequence                       |
| ``node/<id>``     | `NodeRecord`                                                 |
| ``job/<name>``    | `JobRecord` (spec, token hash, admission, placement)         |
| ``permit/<name>`` | `PermitRecord` (the job's current phase, lease, estimates)   |
| ``served/<node>`` | the job whose round-robin turn on that node ended last       |
| ``group/<gid>``   | `GroupRecord` (round-robin member order, nodes)              |
| ``relocation/<job>`` | `RelocationRecord` (the job's latest regrouping directive) |
| ``learn/<job>``   | the job's measured iterations the phase learner keeps        |
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from rollmux.coordinator.service.runtime.api import JobState, NodeState, PermitState
from rollmux.core.model import JobSpec, Lease, Phase, Pool, Relocation, RelocationState

_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def dumps(obj: Any) -> str:
    """Compact JSON with sorted keys (one shared encoder: `json.dumps` with options builds one per call)."""
    return _ENCODER.encode(obj)


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def spec_from_dict(data: dict[str, Any]) -> JobSpec:
    return JobSpec(**data)


@dataclass(slots=True, kw_only=True)
class Meta:
    epoch: int = 0  # last fencing token handed out (cluster-wide, increasing)
    seq: int = 0  # last arrival sequence number

    def to_json(self) -> str:
        return dumps({"epoch": self.epoch, "seq": self.seq})

    @classmethod
    def from_json(cls, raw: str) -> Meta:
        return cls(**json.loads(raw))


@dataclass(slots=True, kw_only=True)
class NodeRecord:
    node_id: str
    pool: Pool
    gpu_type: str
    gpu_count: int
    host_dram_bytes: int
    nvml: dict[str, str] = field(default_factory=dict)
    state: NodeState = NodeState.READY
    streams: bool = False  # has had a sidecar stream: liveness then gates grants on it
    history: list = field(default_factory=list)
    heard_at: float = 0.0  # not stored: monotonic time of the last heartbeat (or stream open)

    def describe(self) -> str:
        return f"node {self.node_id}"

    def to_json(self) -> str:
        return dumps({"node_id": self.node_id, "pool": self.pool.value, "gpu_type": self.gpu_type,
                      "gpu_count": self.gpu_count, "host_dram_bytes": self.host_dram_bytes, "nvml": self.nvml,
                      "state": self.state.value, "streams": self.streams, "history": self.history})

    @classmethod
    def from_json(cls, raw: str) -> NodeRecord:
        d = json.loads(raw)
        d["pool"] = Pool(d["pool"])
        d["state"] = NodeState(d["state"])
        return cls(**d)


@dataclass(slots=True, kw_only=True)
class JobRecord:
    name: str
    spec: JobSpec  # resolved by the profiler (times and state bytes present)
    token_sha256: str  # hex digest of the job token
    nonce_sha256: str  # hex digest of the registration nonce (idempotent retries)
    seq: int  # arrival order
    state: JobState = JobState.PENDING
    group_id: str = ""
    rollout_nodes: tuple[str, ...] = ()  # its pins, as placed (the group record holds the training nodes)
    placement: str = ""  # the policy's explanation
    deployment: str = "disaggregated"  # the chosen rollmux.core.model.Deployment (returned at registration)
    relayed_by: str = ""  # node whose sidecar relayed the registration ("" = registered directly)
    attach_nodes: tuple[str, ...] = ()  # nodes whose sidecar reported a rank of the job attached (I4)
    moves: int = 0  # relocations between groups so far
    # registered on the job's behalf (the Kubernetes scheduler): its driver's relayed registration through
    # a node of its placement attaches to it once (then False)
    attachable: bool = False
    history: list = field(default_factory=list)

    def describe(self) -> str:
        return f"job {self.name}"

    def to_json(self) -> str:
        return dumps({"name": self.name, "spec": spec_to_dict(self.spec), "token_sha256": self.token_sha256,
                      "nonce_sha256": self.nonce_sha256, "seq": self.seq, "state": self.state.value,
                      "group_id": self.group_id, "rollout_nodes": list(self.rollout_nodes),
                      "placement": self.placement, "deployment": self.deployment,
                      "relayed_by": self.relayed_by, "attach_nodes": list(self.attach_nodes), "moves": self.moves,
                      "attachable": self.attachable, "history": self.history})

    @classmethod
    def from_json(cls, raw: str) -> JobRecord:
        d = json.loads(raw)
        d["spec"] = spec_from_dict(d["spec"])
        d["state"] = JobState(d["state"])
        d["rollout_nodes"] = tuple(d["rollout_nodes"])
        d["attach_nodes"] = tuple(d.get("attach_nodes", ()))  # absent from records stored by earlier versions
        d.pop("train_nodes", None)  # stored by earlier versions; the group record holds them
        return cls(**d)


@dataclass(slots=True, kw_only=True)
class PermitRecord:
    """A job's current phase and, while GRANTED, its lease."""

    job: str
    phase: Phase = Phase.ROLLOUT
    iteration: int = 0
    state: PermitState = PermitState.QUEUED
    epoch: int = 0  # fencing token of the current (or last) lease; 0 = never granted
    nodes: tuple[str, ...] = ()  # nodes the lease holds now (shrinks on long-tail migration)
    migrated: bool = False  # a migration directive was issued for this lease
    last_released_epoch: int = 0  # makes a retried release idempotent
    freed_nodes: tuple[str, ...] = ()  # nodes this lease let go before it ended: released by their own sidecar
    # (per-node release) or consolidated away (long-tail migration); a repeated release naming one is a retry
    node_release_s: float = 0.0  # longest phase duration a per-node release of this lease reported so far
    lapsed_nodes: tuple[str, ...] = ()  # nodes of this lease whose sidecar stopped renewing it (a rank died
    # there): freed at their TTL while the others run on; the permit then ends EXPIRED, not RELEASED
    observed_roll_s: float = 0.0  # moving average of measured rollout durations
    observed_train_s: float = 0.0  # moving average of measured train (+ sync) durations
    iter_roll_s: float = 0.0  # this iteration's measured rollout so far (fed to the phase learner at Sync)
    iter_train_s: float = 0.0  # this iteration's measured train so far
    history: list = field(default_factory=list)
    # not stored: monotonic deadlines kept in memory only (reset to now + TTL after a reload,
    # since holders could not renew while the coordinator or the store was down)
    expires_at: dict[str, float] = field(default_factory=dict)  # node -> when its part of the lease lapses
    queued_at: float = 0.0
    grantable_at: float = 0.0  # when the last needed node became free (grant latency starts here)
    picked: bool = True  # the job has been handed this grant (False: granted, no ask answered with it yet)
    asked_at: float = 0.0  # QUEUED: when the job asked for the phase (0: not yet); only an asked phase borrows a
    # node whose turn is another job's (grants.GrantQueues); after a reload a phase counts once asked again
    awaits_ask: bool = False  # a grant made before the job's processes were there was taken back: the phase is
    # granted only once asked (Leases.grant_without_rank)

    def describe(self) -> str:
        return f"permit {self.job} {self.phase.value}({self.iteration}) epoch {self.epoch}"

    def to_lease(self, ttl_s: float) -> Lease:
        """The lease this permit holds, as the wire hands it out (`ttl_s`: how long it lasts unrenewed)."""
        return Lease(job=self.job, phase=self.phase, iteration=self.iteration, epoch=self.epoch, nodes=self.nodes,
                     ttl_s=ttl_s)

    def to_json(self) -> str:
        return dumps({"job": self.job, "phase": self.phase.value, "iteration": self.iteration,
                      "state": self.state.value, "epoch": self.epoch, "nodes": list(self.nodes),
                      "migrated": self.migrated, "last_released_epoch": self.last_released_epoch,
                      "freed_nodes": list(self.freed_nodes), "node_release_s": self.node_release_s,
                      "lapsed_nodes": list(self.lapsed_nodes),
                      "observed_roll_s": self.observed_roll_s, "observed_train_s": self.observed_train_s,
                      "iter_roll_s": self.iter_roll_s, "iter_train_s": self.iter_train_s, "history": self.history})

    @classmethod
    def from_json(cls, raw: str) -> PermitRecord:
        d = json.loads(raw)
        d["phase"] = Phase(d["phase"])
        d["state"] = PermitState(d["state"])
        d["nodes"] = tuple(d["nodes"])
        d["freed_nodes"] = tuple(d.get("freed_nodes", ()))  # absent from records stored by earlier versions
        d["lapsed_nodes"] = tuple(d.get("lapsed_nodes", ()))
        return cls(**d)


@dataclass(slots=True, kw_only=True)
class GroupRecord:
    group_id: str
    train_nodes: tuple[str, ...]
    rollout_nodes: tuple[str, ...]  # in the order they joined the group
    members: tuple[str, ...]  # round-robin order
    train_pool: str = "train"  # pool of its training nodes ("rollout": co-located on rollout-pool GPUs)
    # member -> the training nodes it trains on (where its ranks run: a restart must not choose them again)
    member_train_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> str:
        return dumps({"group_id": self.group_id, "train_nodes": list(self.train_nodes),
                      "rollout_nodes": list(self.rollout_nodes), "members": list(self.members),
                      "train_pool": self.train_pool,
                      "member_train_nodes": {k: list(v) for k, v in self.member_train_nodes.items()}})

    @classmethod
    def from_json(cls, raw: str) -> GroupRecord:
        d = json.loads(raw)
        return cls(group_id=d["group_id"], train_nodes=tuple(d["train_nodes"]),
                   rollout_nodes=tuple(d["rollout_nodes"]), members=tuple(d["members"]),
                   train_pool=d.get("train_pool", "train"),
                   # absent from records stored by earlier versions: their members' nodes are chosen again
                   member_train_nodes={k: tuple(v) for k, v in d.get("member_train_nodes", {}).items()})


@dataclass(slots=True, kw_only=True)
class RelocationRecord:
    """A job's latest regrouping directive (`rollmux.core.model.Relocation`) and its lifecycle."""

    job: str
    from_group: str
    to_group: str  # "" = a new group
    epoch: int  # names the directive (the job acknowledges with it)
    deadline_unix_s: float
    reason: str = ""
    state: RelocationState = RelocationState.PENDING
    rollout_nodes: tuple[str, ...] = ()  # once SWITCHED: the job's nodes in its new group
    train_nodes: tuple[str, ...] = ()
    switched_epoch: int = 0  # once SWITCHED: fencing epoch of the new membership
    reattached_by: str = ""  # once SWITCHED: node whose sidecar re-attached the self-registered job ("" = not yet)
    history: list = field(default_factory=list)

    def describe(self) -> str:
        return f"relocation of job {self.job} epoch {self.epoch}"

    def to_model(self) -> Relocation:
        return Relocation(job=self.job, from_group=self.from_group, to_group=self.to_group, epoch=self.epoch,
                          deadline_unix_s=self.deadline_unix_s, state=self.state, rollout_nodes=self.rollout_nodes,
                          train_nodes=self.train_nodes, switched_epoch=self.switched_epoch, reason=self.reason)

    def to_json(self) -> str:
        return dumps({"job": self.job, "from_group": self.from_group, "to_group": self.to_group, "epoch": self.epoch,
                      "deadline_unix_s": self.deadline_unix_s, "reason": self.reason, "state": self.state.value,
                      "rollout_nodes": list(self.rollout_nodes), "train_nodes": list(self.train_nodes),
                      "switched_epoch": self.switched_epoch, "reattached_by": self.reattached_by,
                      "history": self.history})

    @classmethod
    def from_json(cls, raw: str) -> RelocationRecord:
        d = json.loads(raw)
        d["state"] = RelocationState(d["state"])
        d["rollout_nodes"], d["train_nodes"] = tuple(d["rollout_nodes"]), tuple(d["train_nodes"])
        return cls(**d)
