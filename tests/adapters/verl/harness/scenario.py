"""Run veRL harness jobs against a real RollMux setup on this machine: redis-server, the coordinator
(Redis-backed), one sidecar per pool (``rollmux.demo.launch.LocalCluster``). Shared by the tests,
``benchmarks/verl_cpu.py`` and the veRL demo."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from job import VerlJob

from rollmux.adapters.common import env as adapter_env
from rollmux.demo.launch import LocalCluster
from rollmux.model import JobSpec
from rollmux.sidecar import env


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """One job's outcome."""

    job: VerlJob
    rc: int
    wall_s: float


def run(jobs: Sequence[tuple[VerlJob, dict[str, str] | None]], *, timeout_s: float = 400) -> dict[str, Finished]:
    """Start every job at once (each with its opt-in variables, or none) and wait for all."""
    t0 = time.monotonic()
    procs = [(j, j.start(opt_in)) for j, opt_in in jobs]
    out: dict[str, Finished] = {}
    try:
        for j, p in procs:
            rc = p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
            out[j.name] = Finished(job=j, rc=rc, wall_s=time.monotonic() - t0)
    finally:
        for _, p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    import os
                    import signal

                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return out


@contextlib.contextmanager
def rollmux_setup(workdir: Path, *, lease_ttl_s: float = 10.0) -> Iterator[LocalCluster]:
    """redis-server + Redis-backed coordinator + a rollout-pool and a train-pool sidecar."""
    from redis_proc import RedisProcess

    workdir.mkdir(parents=True, exist_ok=True)
    redis = RedisProcess(workdir)
    redis.start()
    try:
        with LocalCluster(workdir, lease_ttl_s=lease_ttl_s, redis_url=redis.url) as cluster:
            yield cluster
    finally:
        redis.stop()


def register(cluster: LocalCluster, name: str, *, t_roll_s: float = 4.0, t_train_s: float = 4.0,
             slo: float = 3.0) -> str:
    """Register a job as an operator would (until the sidecar relays registrations); its token."""
    spec = JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, slo=slo, model_params_b=0.0002, max_tokens=40,
                   batch_size=4, rollout_state_bytes=1 << 20, train_state_bytes=1 << 20, t_roll_s=t_roll_s,
                   t_train_s=t_train_s)
    return str(cluster.client.register_job(spec).token)


def opt_in(cluster: LocalCluster, name: str, token: str | None) -> dict[str, str]:
    """The variables a platform sets for an opted-in job on this machine (the events go to the
    cluster's phase log)."""
    e = {env.SIDECAR_SOCKET: cluster.sockets["train"], adapter_env.ROLLOUT_SIDECAR_SOCKET: cluster.sockets["rollout"],
         env.EVENT_LOG: str(cluster.events), env.JOB: name}
    if token:
        e[env.JOB_TOKEN] = token
    return e


def redis_available() -> bool:
    return shutil.which("redis-server") is not None or Path("/usr/bin/redis-server").exists()


def phases(cluster_events: Path) -> list[dict[str, Any]]:
    from job import read_jsonl

    return [r for r in read_jsonl(cluster_events) if r.get("owner")]
