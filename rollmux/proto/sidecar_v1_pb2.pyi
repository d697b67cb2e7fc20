from rollmux.proto import rollmux_v1_pb2 as _rollmux_v1_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttachRequest(_message.Message):
    __slots__ = ("job", "job_token", "rank", "pid")
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    job: str
    job_token: str
    rank: int
    pid: int
    def __init__(self, job: _Optional[str] = ..., job_token: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RankEvent(_message.Message):
    __slots__ = ("attached", "granted", "revoked", "migrate", "relocate")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    RELOCATE_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    granted: Granted
    revoked: _rollmux_v1_pb2.PermitRevoked
    migrate: _rollmux_v1_pb2.MigrationDirective
    relocate: _rollmux_v1_pb2.RelocationDirective
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., granted: _Optional[_Union[Granted, _Mapping]] = ..., revoked: _Optional[_Union[_rollmux_v1_pb2.PermitRevoked, _Mapping]] = ..., migrate: _Optional[_Union[_rollmux_v1_pb2.MigrationDirective, _Mapping]] = ..., relocate: _Optional[_Union[_rollmux_v1_pb2.RelocationDirective, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("rank_id", "node_id", "pool")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    node_id: str
    pool: str
    def __init__(self, rank_id: _Optional[str] = ..., node_id: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class Granted(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: _rollmux_v1_pb2.Lease
    def __init__(self, lease: _Optional[_Union[_rollmux_v1_pb2.Lease, _Mapping]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("rank_id", "phase", "iteration", "timeout_s")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    phase: _rollmux_v1_pb2.Phase
    iteration: int
    timeout_s: float
    def __init__(self, rank_id: _Optional[str] = ..., phase: _Optional[_Union[_rollmux_v1_pb2.Phase, str]] = ..., iteration: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease", "waited_s")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    lease: _rollmux_v1_pb2.Lease
    waited_s: float
    def __init__(self, lease: _Optional[_Union[_rollmux_v1_pb2.Lease, _Mapping]] = ..., waited_s: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("rank_id", "epoch", "duration_s", "state_host_bytes")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    STATE_HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    epoch: int
    duration_s: float
    state_host_bytes: int
    def __init__(self, rank_id: _Optional[str] = ..., epoch: _Optional[int] = ..., duration_s: _Optional[float] = ..., state_host_bytes: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("node_released", "next_phase", "next_iteration")
    NODE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PHASE_FIELD_NUMBER: _ClassVar[int]
    NEXT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    node_released: bool
    next_phase: _rollmux_v1_pb2.Phase
    next_iteration: int
    def __init__(self, node_released: _Optional[bool] = ..., next_phase: _Optional[_Union[_rollmux_v1_pb2.Phase, str]] = ..., next_iteration: _Optional[int] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("rank_id", "epoch", "finished", "total")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    epoch: int
    finished: int
    total: int
    def __init__(self, rank_id: _Optional[str] = ..., epoch: _Optional[int] = ..., finished: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class ProgressResponse(_message.Message):
    __slots__ = ("migrate",)
    MIGRATE_FIELD_NUMBER: _ClassVar[int]
    migrate: _rollmux_v1_pb2.MigrationDirective
    def __init__(self, migrate: _Optional[_Union[_rollmux_v1_pb2.MigrationDirective, _Mapping]] = ...) -> None: ...

class RelocateRequest(_message.Message):
    __slots__ = ("rank_id", "epoch")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    epoch: int
    def __init__(self, rank_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RelocateResponse(_message.Message):
    __slots__ = ("directive", "note")
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    directive: _rollmux_v1_pb2.RelocationDirective
    note: str
    def __init__(self, directive: _Optional[_Union[_rollmux_v1_pb2.RelocationDirective, _Mapping]] = ..., note: _Optional[str] = ...) -> None: ...

class DetachRequest(_message.Message):
    __slots__ = ("rank_id", "job_done")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_DONE_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    job_done: bool
    def __init__(self, rank_id: _Optional[str] = ..., job_done: _Optional[bool] = ...) -> None: ...

class DetachResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("spec", "nonce")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    spec: _rollmux_v1_pb2.JobSpec
    nonce: str
    def __init__(self, spec: _Optional[_Union[_rollmux_v1_pb2.JobSpec, _Mapping]] = ..., nonce: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("job", "job_token", "deployment", "state")
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job: str
    job_token: str
    deployment: str
    state: str
    def __init__(self, job: _Optional[str] = ..., job_token: _Optional[str] = ..., deployment: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("node_id", "pool", "connection", "ranks", "cached_state_host_bytes", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_STATE_HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    pool: str
    connection: str
    ranks: int
    cached_state_host_bytes: int
    events: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., pool: _Optional[str] = ..., connection: _Optional[str] = ..., ranks: _Optional[int] = ..., cached_state_host_bytes: _Optional[int] = ..., events: _Optional[_Iterable[str]] = ...) -> None: ...
