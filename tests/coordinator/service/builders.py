"""Builders for runtime tests: a fake clock and a runtime with registered nodes."""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.profiler import resolve
from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.core.model import ClusterSpec, JobSpec, Pool

TB = 10**12


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def make_runtime(n_rollout: int = 4, n_train: int = 2, *, ttl: float = 10.0, heartbeat_s: float = 1e6,
                 clock: FakeClock | None = None, modes: bool = False) -> tuple[Runtime, FakeClock]:
    """A runtime with connected nodes; heartbeats lapse only in tests that ask (`heartbeat_s`)."""
    clock = clock or FakeClock()
    rt = Runtime(ClusterSpec(), ServiceConfig(lease_ttl_s=ttl, heartbeat_interval_s=heartbeat_s,
                                              policy=PolicyConfig.live(modes=modes)), clock=clock, wall=clock)
    for i in range(n_rollout):
        rt.register_node(node_id=f"r{i}", pool=Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * TB,
                         nvml={})
    for i in range(n_train):
        rt.register_node(node_id=f"t{i}", pool=Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * TB,
                         nvml={})
    for node_id in list(rt.state.nodes):
        rt.node_connected(node_id)  # READY only with a stream: the runtime stands for the sidecar's
    rt.take_changes()
    return rt, clock


def spec(name: str, *, nr: int = 8, nt: int = 8, t_roll_s: float = 100.0, t_train_s: float = 100.0,
         slo: float = 2.0) -> JobSpec:
    s = JobSpec(name=name, n_rollout_gpus=nr, n_train_gpus=nt, t_roll_s=t_roll_s, t_train_s=t_train_s, slo=slo,
                rollout_state_bytes=10**9, train_state_bytes=10**9)
    return resolve(s, ClusterSpec())


def register(rt: Runtime, name: str, **kw: object):  # type: ignore[no-untyped-def]
    job, _ = rt.register_job(spec(name, **kw), token_sha256="t" + name, nonce_sha256="n" + name)  # type: ignore[arg-type]
    return job


def grant(rt: Runtime, name: str):  # type: ignore[no-untyped-def]
    """Ask for the job's current phase and return its permit, which must be GRANTED."""
    from rollmux.coordinator.service.runtime.api import PermitState

    p = rt.state.permits[name]
    got = rt.acquire(name, p.phase, p.iteration)
    assert got is not None and got.state is PermitState.GRANTED, views.wait_reason(rt, name)
    return got
