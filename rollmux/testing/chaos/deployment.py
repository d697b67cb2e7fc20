"""A whole local deployment as real processes: redis-server, a leader and a standby coordinator on
it (bootstrap secret set), and one ``rollmux sidecar`` per node."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rollmux.testing.chaos.procs import CoordinatorProcess, ProcessStartError, RedisProcess, SidecarProcess


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Sizes and timings of the deployment."""

    rollout_nodes: int = 2
    train_nodes: int = 2
    standby: bool = True  # a second coordinator (another instance id) waits on the leadership lease
    lease_ttl_s: float = 2.0  # run-permit lease TTL
    leader_ttl_s: float = 1.0  # leadership lease TTL (how soon the standby takes over)
    heartbeat_s: float = 0.2  # sidecar heartbeat period

    def __post_init__(self) -> None:
        if self.rollout_nodes < 1 or self.train_nodes < 1:
            raise ValueError(f"need a node per pool, got {self.rollout_nodes} rollout, {self.train_nodes} train")
        if not (0 < self.heartbeat_s < self.lease_ttl_s / 2):
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be > 0 and under half of lease_ttl_s")
        if self.leader_ttl_s <= 0:
            raise ValueError(f"leader_ttl_s={self.leader_ttl_s} must be > 0")


class Deployment:
    """Starts and owns the processes; `stop` ends them all (also after a failed start)."""

    def __init__(self, workdir: Path, topology: Topology) -> None:
        self.dir, self.topo = workdir, topology
        self.secret = secrets.token_urlsafe(24)
        self.secret_file = workdir / "secret"
        self.sockdir = Path(tempfile.mkdtemp(prefix="rmxc-"))  # short: sun_path is 107 bytes
        self.redis = RedisProcess(workdir)
        flags = ["--secret-file", str(self.secret_file), "--lease-ttl", str(topology.lease_ttl_s),
                 "--leader-ttl", str(topology.leader_ttl_s), "--heartbeat-interval", str(topology.heartbeat_s),
                 "--gpus-per-node", "1"]
        ids = ["coord-a", "coord-b"] if topology.standby else ["coord-a"]
        self.coordinators = [CoordinatorProcess(self.redis.url, workdir, instance_id=i, extra=flags) for i in ids]
        self.address = ",".join(c.address for c in self.coordinators)
        nodes = [(f"r{i}", "rollout") for i in range(topology.rollout_nodes)]
        nodes += [(f"t{i}", "train") for i in range(topology.train_nodes)]
        self.sidecars = {n: SidecarProcess(self.address, workdir, node_id=n, pool=pool,
                                           socket_path=str(self.sockdir / f"{n}.sock"),
                                           extra=["--secret-file", str(self.secret_file), "--heartbeat-s",
                                                  str(topology.heartbeat_s), "--event-log",
                                                  str(workdir / f"sidecar-{n}.events.jsonl")])
                         for n, pool in nodes}

    @property
    def operator_token(self) -> str:
        from rollmux.wire import auth

        return auth.operator_token(self.secret)

    def start(self) -> Deployment:
        self.secret_file.write_text(self.secret)
        self.secret_file.chmod(0o600)
        try:
            self.redis.start()
            self.coordinators[0].start()
            if self.wait_leader(60.0) is None:
                raise ProcessStartError(f"coordinator {self.coordinators[0].instance_id} did not lead within 60s; "
                                        f"see {self.coordinators[0].log}")
            for c in self.coordinators[1:]:
                c.start()
            for s in self.sidecars.values():
                s.start(wait=False)
            for s in self.sidecars.values():
                s.wait_ready(90.0)
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self) -> CoordinatorProcess | None:
        """The coordinator that leads now (None while none does)."""
        return next((c for c in self.coordinators if c.leading(self.operator_token)), None)

    def wait_leader(self, timeout_s: float, *, not_: CoordinatorProcess | None = None) -> CoordinatorProcess | None:
        """Wait until a coordinator (other than `not_`) leads; None if none did in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for c in self.coordinators:
                if c is not not_ and c.leading(self.operator_token):
                    return c
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        for s in self.sidecars.values():
            s.stop(5.0)
        for c in self.coordinators:
            c.kill()
        self.redis.stop()
        shutil.rmtree(self.sockdir, ignore_errors=True)
