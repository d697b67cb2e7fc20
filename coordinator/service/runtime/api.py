"""Contracts of the live coordinator: lifecycle enums, configuration and its internal errors.

Every error a caller can provoke is a `ServiceError` (`rollmux.wire.errors`, re-exported here for
the coordinator's own modules) carrying an `ErrorCode`; the servicer translates it at the RPC
boundary. A request refused with a `ServiceError` has changed no state (validation happens before
any transition, and transitions are decided before they are applied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.migration import MigrationRule
from rollmux.core import lifecycle
from rollmux.core.errors import RollMuxError
from rollmux.wire.errors import (  # noqa: F401  (the coordinator's modules import them from here)
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    NotReadyError,
    OutOfOrderError,
    PermissionDeniedError,
    PlacementMismatchError,
    ServiceError,
    StaleEpochError,
    UnauthenticatedError,
)

# ----------------------------------------------------------------------------------------------
# Lifecycles (transition tables live in `states.py`)
# ----------------------------------------------------------------------------------------------


class JobState(str, Enum):
    """Lifecycle of a registered job.

    PENDING -> ADMITTED when the free nodes can host its placement (strictly in arrival order);
    PENDING or ADMITTED -> REMOVED on deregistration or operator removal. REMOVED is terminal and
    its record is deleted from the store in the same transaction.
    """

    PENDING = "pending"
    ADMITTED = "admitted"
    REMOVED = "removed"


class PermitState(str, Enum):
    """Lifecycle of a job's current phase permit (one per job at a time).

    QUEUED: waiting in the FIFO queue of every node the phase needs. GRANTED: a lease (epoch + TTL)
    holds those nodes. RELEASED: the phase finished (terminal; the job's next phase gets a fresh
    QUEUED permit). EXPIRED / REVOKED: the lease lapsed or an operator took it; the permit is parked
    out of the queues until the job asks for it again, then it is QUEUED at the tail.
    CANCELLED: the job was removed (terminal).
    """

    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    REVOKED = "revoked"
    CANCELLED = "cancelled"


class NodeState(str, Enum):
    """Lifecycle of a registered node.

    READY: usable. LOST: its sidecar's stream closed, or stayed open without a heartbeat for
    `ServiceConfig.heartbeat_lapse_s`; no new permit is granted on it until the sidecar reconnects
    or its heartbeats resume (running leases are left to their TTL: without heartbeats nobody
    renews them, so they expire and are revoked as usual). DRAINING: an operator asked to drain
    it: the running permit finishes, nothing new starts and no new job is placed on it. DRAINED:
    draining and idle.
    """

    READY = "ready"
    LOST = "lost"
    DRAINING = "draining"
    DRAINED = "drained"


class WaitOutcome(str, Enum):
    """How a bounded permit wait ended."""

    GRANTED = "granted"
    TIMEOUT = "timeout"
    JOB_REMOVED = "job-removed"


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Knobs of the live coordinator (CLI flags map one to one)."""

    lease_ttl_s: float = 10.0  # a granted permit lapses unless renewed within this many seconds
    max_wait_s: float = 300.0  # longest server-side permit wait one AcquirePermit call may ask for
    migration_threshold: float = 0.8  # rollout progress (finished/total) at which it is tail-bound
    migration_tail_share: float = 0.125  # share of its rollout nodes a tail-bound rollout keeps (>= 1 node)
    estimate_alpha: float = 0.5  # weight of the newest measured duration in the moving average
    heartbeat_interval_s: float = 2.0  # how often sidecars should send heartbeats
    heartbeat_lapse_intervals: int = 3  # a connected node silent this many intervals turns LOST
    reap_interval_s: float = 0.05  # how often expired leases are looked for
    max_name_len: int = 128  # longest job or node name accepted
    max_nvml_entries: int = 64  # most NVML facts one node may report
    max_request_bytes: int = 1 << 20  # largest request accepted (INVALID_ARGUMENT naming the biggest field)
    max_nodes_per_job: int = 1024  # most nodes one job may ask for in either pool (more is refused)
    relayed_registration: bool = True  # accept RegisterJob relayed by a node's sidecar with its node token
    # The placement policy's knobs (`PolicyConfig.live` by default: deployment modes opt-in, learned
    # phase times, regrouping as directives, work-aware joins, best moves, regrouping on learning).
    policy: PolicyConfig = field(default_factory=PolicyConfig.live)
    relocation_deadline_s: float = 120.0  # a job that has not switched by then keeps its place
    relocation_horizon_s: float = 3600.0  # remaining run assumed for a job when weighing a move

    def __post_init__(self) -> None:
        for name in ("lease_ttl_s", "max_wait_s", "heartbeat_interval_s", "reap_interval_s",
                     "relocation_deadline_s", "relocation_horizon_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name}={v!r} is invalid: expected a positive number of seconds")
        if not (isinstance(self.heartbeat_lapse_intervals, int) and self.heartbeat_lapse_intervals >= 1):
            raise ValueError(f"heartbeat_lapse_intervals={self.heartbeat_lapse_intervals!r} is invalid: "
                             "expected a whole number >= 1")
        for name in ("migration_threshold", "migration_tail_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected (0, 1]")
        if not 0.0 < self.estimate_alpha <= 1.0:
            raise ValueError(f"estimate_alpha={self.estimate_alpha!r} is invalid: expected (0, 1]")


    @property
    def migration_rule(self) -> MigrationRule:
        """The long-tail migration rule, shared with the simulator (`policy.migration`)."""
        return MigrationRule(threshold=self.migration_threshold, tail_share=self.migration_tail_share)

    @property
    def heartbeat_lapse_s(self) -> float:
        """Silence after which a node whose stream is still open is declared LOST."""
        return self.heartbeat_lapse_intervals * self.heartbeat_interval_s


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


class CoordinatorTransitionError(lifecycle.IllegalTransitionError):
    """A state machine was asked for an edge its transition table does not allow (a bug)."""


class StoreError(RollMuxError):
    """The state store failed."""


class StoreUnavailableError(StoreError):
    """The state store cannot be reached (Redis down or restarting)."""


class StaleFenceError(StoreError):
    """A commit carried a leader fence that is no longer current: another coordinator took over."""
