"""The node agent's records: its knobs (:class:`AgentConfig`) and one job's state on the node (:class:`LocalJob`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollmux.core.model import Lease, Pool
from rollmux.sidecar.api import RankLease
from rollmux.sidecar.gpu import DEFAULT_PROCESS_LIMIT_BYTES
from rollmux.wire.client import JobClient


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Knobs of one node agent."""

    node_id: str  # the node's id at the coordinator
    pool: Pool  # the node's pool
    gpu_mem_limit_bytes: int = DEFAULT_PROCESS_LIMIT_BYTES  # each process of a job may keep this much GPU memory after a phase (its CUDA context)
    memory_wait_s: float = 30.0  # how long to wait for the job's GPU memory to drop before releasing anyway
    heartbeat_s: float = 0.5  # heartbeat period on the coordinator stream (renews running leases)
    event_log: str | None = None  # JSON-lines file of node events (grants, releases, rank deaths)

    def __post_init__(self) -> None:
        if self.gpu_mem_limit_bytes < 0:
            raise ValueError(f"gpu_mem_limit_bytes={self.gpu_mem_limit_bytes} must be >= 0")
        if self.heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be > 0")


@dataclass(slots=True, kw_only=True)
class LocalJob:
    """One job's ranks on this node and its current permit here (guarded by the agent's lock)."""

    name: str
    client: JobClient
    ranks: dict[str, RankLease] = field(default_factory=dict)
    permit: Lease | None = None  # granted on this node, not yet released
    acquiring: tuple[str, int] | None = None  # (phase, iteration) a rank is asking the coordinator for
    releasing: bool = False  # the last local rank is releasing the node
    released: dict[str, float] = field(default_factory=dict)  # rank_id -> its phase duration, s
    last_released_epoch: int = 0
    granted_at: float = 0.0  # wall time the current permit reached this node
    aborted: str | None = None  # why the job stopped on this node (a rank died, ...)

    def live_ranks(self) -> list[RankLease]:
        return [r for r in self.ranks.values() if r.live]


__all__ = ["AgentConfig", "LocalJob"]
