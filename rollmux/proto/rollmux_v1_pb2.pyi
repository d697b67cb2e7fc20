from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pool(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOL_UNSPECIFIED: _ClassVar[Pool]
    POOL_ROLLOUT: _ClassVar[Pool]
    POOL_TRAIN: _ClassVar[Pool]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_ROLLOUT: _ClassVar[Phase]
    PHASE_TRAIN: _ClassVar[Phase]
    PHASE_SYNC: _ClassVar[Phase]

class WaitOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_OUTCOME_UNSPECIFIED: _ClassVar[WaitOutcome]
    WAIT_OUTCOME_GRANTED: _ClassVar[WaitOutcome]
    WAIT_OUTCOME_TIMEOUT: _ClassVar[WaitOutcome]
    WAIT_OUTCOME_JOB_REMOVED: _ClassVar[WaitOutcome]
POOL_UNSPECIFIED: Pool
POOL_ROLLOUT: Pool
POOL_TRAIN: Pool
PHASE_UNSPECIFIED: Phase
PHASE_ROLLOUT: Phase
PHASE_TRAIN: Phase
PHASE_SYNC: Phase
WAIT_OUTCOME_UNSPECIFIED: WaitOutcome
WAIT_OUTCOME_GRANTED: WaitOutcome
WAIT_OUTCOME_TIMEOUT: WaitOutcome
WAIT_OUTCOME_JOB_REMOVED: WaitOutcome

class JobSpec(_message.Message):
    __slots__ = ("name", "n_rollout_gpus", "n_train_gpus", "slo", "model_params_b", "max_tokens", "batch_size", "turns", "rollout_state_bytes", "train_state_bytes", "t_roll_s", "t_train_s", "deployment", "elastic")
    NAME_FIELD_NUMBER: _ClassVar[int]
    N_ROLLOUT_GPUS_FIELD_NUMBER: _ClassVar[int]
    N_TRAIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_B_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    T_ROLL_S_FIELD_NUMBER: _ClassVar[int]
    T_TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    n_rollout_gpus: int
    n_train_gpus: int
    slo: float
    model_params_b: float
    max_tokens: int
    batch_size: int
    turns: int
    rollout_state_bytes: int
    train_state_bytes: int
    t_roll_s: float
    t_train_s: float
    deployment: str
    elastic: bool
    def __init__(self, name: _Optional[str] = ..., n_rollout_gpus: _Optional[int] = ..., n_train_gpus: _Optional[int] = ..., slo: _Optional[float] = ..., model_params_b: _Optional[float] = ..., max_tokens: _Optional[int] = ..., batch_size: _Optional[int] = ..., turns: _Optional[int] = ..., rollout_state_bytes: _Optional[int] = ..., train_state_bytes: _Optional[int] = ..., t_roll_s: _Optional[float] = ..., t_train_s: _Optional[float] = ..., deployment: _Optional[str] = ..., elastic: _Optional[bool] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("job", "phase", "iteration", "epoch", "nodes", "ttl_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    phase: Phase
    iteration: int
    epoch: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    ttl_s: float
    def __init__(self, job: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., iteration: _Optional[int] = ..., epoch: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "pool", "gpu_type", "gpu_count", "host_dram_bytes", "nvml")
    class NvmlEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    HOST_DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    NVML_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    pool: Pool
    gpu_type: str
    gpu_count: int
    host_dram_bytes: int
    nvml: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., pool: _Optional[_Union[Pool, str]] = ..., gpu_type: _Optional[str] = ..., gpu_count: _Optional[int] = ..., host_dram_bytes: _Optional[int] = ..., nvml: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_id", "state", "heartbeat_interval_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    heartbeat_interval_s: float
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class NodeHeartbeat(_message.Message):
    __slots__ = ("active_epochs", "nvml")
    class NvmlEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ACTIVE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    NVML_FIELD_NUMBER: _ClassVar[int]
    active_epochs: _containers.RepeatedScalarFieldContainer[int]
    nvml: _containers.ScalarMap[str, str]
    def __init__(self, active_epochs: _Optional[_Iterable[int]] = ..., nvml: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GrantWithoutRank(_message.Message):
    __slots__ = ("job", "epoch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class NodeUp(_message.Message):
    __slots__ = ("heartbeat", "unused")
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UNUSED_FIELD_NUMBER: _ClassVar[int]
    heartbeat: NodeHeartbeat
    unused: GrantWithoutRank
    def __init__(self, heartbeat: _Optional[_Union[NodeHeartbeat, _Mapping]] = ..., unused: _Optional[_Union[GrantWithoutRank, _Mapping]] = ...) -> None: ...

class PermitGranted(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class PermitRevoked(_message.Message):
    __slots__ = ("job", "epoch", "reason")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    reason: str
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class MigrationDirective(_message.Message):
    __slots__ = ("job", "epoch", "keep_nodes", "release_nodes")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEEP_NODES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_NODES_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    keep_nodes: _containers.RepeatedScalarFieldContainer[str]
    release_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., keep_nodes: _Optional[_Iterable[str]] = ..., release_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class RelocationDirective(_message.Message):
    __slots__ = ("job", "from_group", "to_group", "epoch", "deadline_unix_s", "state", "rollout_nodes", "train_nodes", "switched_epoch", "reason")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FROM_GROUP_FIELD_NUMBER: _ClassVar[int]
    TO_GROUP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_NODES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_NODES_FIELD_NUMBER: _ClassVar[int]
    SWITCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job: str
    from_group: str
    to_group: str
    epoch: int
    deadline_unix_s: float
    state: str
    rollout_nodes: _containers.RepeatedScalarFieldContainer[str]
    train_nodes: _containers.RepeatedScalarFieldContainer[str]
    switched_epoch: int
    reason: str
    def __init__(self, job: _Optional[str] = ..., from_group: _Optional[str] = ..., to_group: _Optional[str] = ..., epoch: _Optional[int] = ..., deadline_unix_s: _Optional[float] = ..., state: _Optional[str] = ..., rollout_nodes: _Optional[_Iterable[str]] = ..., train_nodes: _Optional[_Iterable[str]] = ..., switched_epoch: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("node_id", "state", "holder")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    holder: Lease
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., holder: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class NodeDown(_message.Message):
    __slots__ = ("snapshot", "granted", "revoked", "migrate", "relocate")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    RELOCATE_FIELD_NUMBER: _ClassVar[int]
    snapshot: NodeSnapshot
    granted: PermitGranted
    revoked: PermitRevoked
    migrate: MigrationDirective
    relocate: RelocationDirective
    def __init__(self, snapshot: _Optional[_Union[NodeSnapshot, _Mapping]] = ..., granted: _Optional[_Union[PermitGranted, _Mapping]] = ..., revoked: _Optional[_Union[PermitRevoked, _Mapping]] = ..., migrate: _Optional[_Union[MigrationDirective, _Mapping]] = ..., relocate: _Optional[_Union[RelocationDirective, _Mapping]] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("spec", "nonce", "relay_node", "attachable")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    RELAY_NODE_FIELD_NUMBER: _ClassVar[int]
    ATTACHABLE_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    nonce: str
    relay_node: str
    attachable: bool
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., nonce: _Optional[str] = ..., relay_node: _Optional[str] = ..., attachable: _Optional[bool] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job", "state", "group_id", "rollout_nodes", "train_nodes", "next_phase", "next_iteration", "permit_state", "lease", "observed_roll_s", "observed_train_s", "pending_position", "placement", "relayed_by", "relocation", "learned_roll_s", "learned_train_s", "learned_solo_s", "deployment")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_NODES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PHASE_FIELD_NUMBER: _ClassVar[int]
    NEXT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    PERMIT_STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_ROLL_S_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    PENDING_POSITION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    RELAYED_BY_FIELD_NUMBER: _ClassVar[int]
    RELOCATION_FIELD_NUMBER: _ClassVar[int]
    LEARNED_ROLL_S_FIELD_NUMBER: _ClassVar[int]
    LEARNED_TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    LEARNED_SOLO_S_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    job: str
    state: str
    group_id: str
    rollout_nodes: _containers.RepeatedScalarFieldContainer[str]
    train_nodes: _containers.RepeatedScalarFieldContainer[str]
    next_phase: Phase
    next_iteration: int
    permit_state: str
    lease: Lease
    observed_roll_s: float
    observed_train_s: float
    pending_position: int
    placement: str
    relayed_by: str
    relocation: RelocationDirective
    learned_roll_s: float
    learned_train_s: float
    learned_solo_s: float
    deployment: str
    def __init__(self, job: _Optional[str] = ..., state: _Optional[str] = ..., group_id: _Optional[str] = ..., rollout_nodes: _Optional[_Iterable[str]] = ..., train_nodes: _Optional[_Iterable[str]] = ..., next_phase: _Optional[_Union[Phase, str]] = ..., next_iteration: _Optional[int] = ..., permit_state: _Optional[str] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., observed_roll_s: _Optional[float] = ..., observed_train_s: _Optional[float] = ..., pending_position: _Optional[int] = ..., placement: _Optional[str] = ..., relayed_by: _Optional[str] = ..., relocation: _Optional[_Union[RelocationDirective, _Mapping]] = ..., learned_roll_s: _Optional[float] = ..., learned_train_s: _Optional[float] = ..., learned_solo_s: _Optional[float] = ..., deployment: _Optional[str] = ...) -> None: ...

class RegisterJobResponse(_message.Message):
    __slots__ = ("job_token", "status", "deployment")
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    job_token: str
    status: JobStatus
    deployment: str
    def __init__(self, job_token: _Optional[str] = ..., status: _Optional[_Union[JobStatus, _Mapping]] = ..., deployment: _Optional[str] = ...) -> None: ...

class AcquirePermitRequest(_message.Message):
    __slots__ = ("job", "phase", "iteration", "timeout_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    phase: Phase
    iteration: int
    timeout_s: float
    def __init__(self, job: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., iteration: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class AcquirePermitResponse(_message.Message):
    __slots__ = ("outcome", "lease", "reason", "waited_s")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    outcome: WaitOutcome
    lease: Lease
    reason: str
    waited_s: float
    def __init__(self, outcome: _Optional[_Union[WaitOutcome, str]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., reason: _Optional[str] = ..., waited_s: _Optional[float] = ...) -> None: ...

class RenewPermitRequest(_message.Message):
    __slots__ = ("job", "epoch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RenewPermitResponse(_message.Message):
    __slots__ = ("ttl_s",)
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    ttl_s: float
    def __init__(self, ttl_s: _Optional[float] = ...) -> None: ...

class ReleasePermitRequest(_message.Message):
    __slots__ = ("job", "epoch", "duration_s", "node_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    duration_s: float
    node_id: str
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., duration_s: _Optional[float] = ..., node_id: _Optional[str] = ...) -> None: ...

class ReleasePermitResponse(_message.Message):
    __slots__ = ("next_phase", "next_iteration", "already_released", "held_nodes")
    NEXT_PHASE_FIELD_NUMBER: _ClassVar[int]
    NEXT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    HELD_NODES_FIELD_NUMBER: _ClassVar[int]
    next_phase: Phase
    next_iteration: int
    already_released: bool
    held_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, next_phase: _Optional[_Union[Phase, str]] = ..., next_iteration: _Optional[int] = ..., already_released: _Optional[bool] = ..., held_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class AdvancePermitRequest(_message.Message):
    __slots__ = ("job", "epoch", "duration_s", "timeout_s", "node_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    duration_s: float
    timeout_s: float
    node_id: str
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., duration_s: _Optional[float] = ..., timeout_s: _Optional[float] = ..., node_id: _Optional[str] = ...) -> None: ...

class AdvancePermitResponse(_message.Message):
    __slots__ = ("released", "next")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    released: ReleasePermitResponse
    next: AcquirePermitResponse
    def __init__(self, released: _Optional[_Union[ReleasePermitResponse, _Mapping]] = ..., next: _Optional[_Union[AcquirePermitResponse, _Mapping]] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("job", "epoch", "finished", "total")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    finished: int
    total: int
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., finished: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("migrate", "ttl_s")
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    migrate: MigrationDirective
    ttl_s: float
    def __init__(self, migrate: _Optional[_Union[MigrationDirective, _Mapping]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class AckRelocationRequest(_message.Message):
    __slots__ = ("job", "epoch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class AckRelocationResponse(_message.Message):
    __slots__ = ("directive", "note")
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    directive: RelocationDirective
    note: str
    def __init__(self, directive: _Optional[_Union[RelocationDirective, _Mapping]] = ..., note: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ReportAttachRequest(_message.Message):
    __slots__ = ("node_id", "job")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job: str
    def __init__(self, node_id: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class ReportAttachResponse(_message.Message):
    __slots__ = ("placement_nodes", "attach_nodes")
    PLACEMENT_NODES_FIELD_NUMBER: _ClassVar[int]
    ATTACH_NODES_FIELD_NUMBER: _ClassVar[int]
    placement_nodes: _containers.RepeatedScalarFieldContainer[str]
    attach_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, placement_nodes: _Optional[_Iterable[str]] = ..., attach_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class DeregisterJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class DeregisterJobResponse(_message.Message):
    __slots__ = ("released_nodes",)
    RELEASED_NODES_FIELD_NUMBER: _ClassVar[int]
    released_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, released_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "pool", "gpu_type", "gpu_count", "host_dram_bytes", "state", "group_id", "queue", "holder", "connected")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    HOST_DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    pool: Pool
    gpu_type: str
    gpu_count: int
    host_dram_bytes: int
    state: str
    group_id: str
    queue: _containers.RepeatedScalarFieldContainer[str]
    holder: Lease
    connected: bool
    def __init__(self, node_id: _Optional[str] = ..., pool: _Optional[_Union[Pool, str]] = ..., gpu_type: _Optional[str] = ..., gpu_count: _Optional[int] = ..., host_dram_bytes: _Optional[int] = ..., state: _Optional[str] = ..., group_id: _Optional[str] = ..., queue: _Optional[_Iterable[str]] = ..., holder: _Optional[_Union[Lease, _Mapping]] = ..., connected: _Optional[bool] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group_id", "jobs", "rollout_nodes", "train_nodes", "usd_per_h")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_NODES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_NODES_FIELD_NUMBER: _ClassVar[int]
    USD_PER_H_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    rollout_nodes: _containers.RepeatedScalarFieldContainer[str]
    train_nodes: _containers.RepeatedScalarFieldContainer[str]
    usd_per_h: float
    def __init__(self, group_id: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ..., rollout_nodes: _Optional[_Iterable[str]] = ..., train_nodes: _Optional[_Iterable[str]] = ..., usd_per_h: _Optional[float] = ...) -> None: ...

class ClusterStateResponse(_message.Message):
    __slots__ = ("nodes", "groups", "jobs", "pending", "usd_per_h", "ready", "leader_fence")
    NODES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    USD_PER_H_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    LEADER_FENCE_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    pending: _containers.RepeatedScalarFieldContainer[str]
    usd_per_h: float
    ready: bool
    leader_fence: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., pending: _Optional[_Iterable[str]] = ..., usd_per_h: _Optional[float] = ..., ready: _Optional[bool] = ..., leader_fence: _Optional[int] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: _Optional[str] = ...) -> None: ...

class RemoveJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...
