"""Run veRL harness jobs against a real RollMux setup on this machine: redis-server, the coordinator
(Redis-backed), one sidecar per pool (``rollmux.demo.launch.LocalCluster``). Shared by the tests,
``benchmarks/verl_cpu.py`` and the veRL demo."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from job import START_FILE, VerlJob

from rollmux.adapters.common import env as adapter_env
from rollmux.demo.launch import LocalCluster
from rollmux.shim import env


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """One job's outcome."""

    job: VerlJob
    rc: int
    wall_s: float


SECRET = "harness-bootstrap-secret"
"""The coordinator's bootstrap secret in the harness scenarios (the sidecars read it from a file)."""


def run(jobs: Sequence[tuple[VerlJob, dict[str, str] | None]], *, timeout_s: float = 600,
        watch: Callable[[dict[str, subprocess.Popen[bytes]]], None] | None = None,
        start_file: Path | None = None) -> dict[str, Finished]:
    """Start every job at once (each with its opt-in variables, or none) and wait for all; `watch` is
    called with the running processes about twice a second.

    With `start_file`, every trainer waits before its first phase (``rollmux_verl_cpu._start_gate``) until
    every job still running got there, so their first phases start together: start-up alone varies by tens of
    seconds between two jobs on a loaded box, more than a whole 2-step run. A job that exited (the
    killed victim, a failure) is not waited for; it used to open the gate for all, so a job still
    starting up could find the others done (legacyjob ran both steps before v1job's first permit)."""
    t0 = time.monotonic()
    extra = {START_FILE: str(start_file)} if start_file is not None else {}
    procs = {j.name: (j, j.start({**(opt_in or {}), **extra} or None)) for j, opt_in in jobs}
    out: dict[str, Finished] = {}
    try:
        while len(out) < len(procs):
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"jobs still running after {timeout_s:g}s: {sorted(set(procs) - set(out))}")
            for name, (j, p) in procs.items():
                if name not in out and p.poll() is not None:
                    out[name] = Finished(job=j, rc=p.returncode, wall_s=time.monotonic() - t0)
            if start_file is not None and not start_file.exists() and \
                    all(at_start_gate(j) for name, (j, _) in procs.items() if name not in out):
                start_file.touch()  # every job still running waits at its gate (one that exited waits for nobody)
            if watch is not None:
                watch({n: p for n, (_, p) in procs.items() if n not in out})
            time.sleep(0.5)
    finally:
        for j, p in procs.values():
            if p.poll() is None:
                kill(j, p)
    return out


def at_start_gate(job: VerlJob) -> bool:
    """True once the job's trainer waits at its start gate for its start file (it recorded a ``start_gate`` event)."""
    from job import read_jsonl

    path = job.workdir / "harness.jsonl"
    return path.exists() and any(r.get("kind") == "start_gate" for r in read_jsonl(path))


def kill(job: VerlJob, proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the job at once, as a node or pod failure would: its driver's process
    group and every Ray process it started (found by the job's own RAY_TMPDIR in their environment)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in ray_pids(job):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def ray_pids(job: VerlJob) -> list[int]:
    """Pids of every process the job started (its driver and its Ray processes: they carry the job's own
    RAY_TMPDIR in their environment)."""
    marker = f"RAY_TMPDIR={job.ray_tmp()}".encode()
    out = []
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue
    return out


@contextlib.contextmanager
def rollmux_setup(workdir: Path, *, lease_ttl_s: float = 10.0) -> Iterator[LocalCluster]:
    """redis-server + Redis-backed coordinator with a bootstrap secret + a rollout-pool and a train-pool
    sidecar started with ``--secret-file`` (as the Helm chart runs them)."""
    from rollmux.testing.chaos.procs import (
        RedisProcess,  # one redis-server helper for harnesses, chaos and tests
    )

    workdir.mkdir(parents=True, exist_ok=True)
    redis = RedisProcess(workdir)
    redis.start()
    try:
        with LocalCluster(workdir, lease_ttl_s=lease_ttl_s, redis_url=redis.url, secret=SECRET) as cluster:
            yield cluster
    finally:
        redis.stop()


def add_sidecar(cluster: LocalCluster, node: str, pool: str) -> str:
    """Start one more sidecar (`node` of `pool`) beside the cluster's two, as they run; its socket path."""
    path = str(Path(cluster.sockets["train"]).parent / f"{node}.sock")
    ready = cluster.dir / f"{node}.ready"
    cluster.procs.spawn(node, ["-m", "rollmux", "sidecar", "--coordinator", cluster.server.address, "--node-id", node,
                               "--pool", pool, "--socket", path, "--no-nvml", "--event-log", str(cluster.node_events),
                               "--ready-file", str(ready), "--secret-file", str(cluster.dir / "secret")],
                        log=cluster.dir / f"{node}.log")
    deadline = time.monotonic() + 120
    while not ready.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"sidecar {node} did not come up; see {cluster.dir / (node + '.log')}")
        time.sleep(0.05)
    return path


PHASE_S = "2,1"
"""Solo rollout and train seconds of a harness job on this CPU, as a user declares them from a run alone
(``ROLLMUX_PHASE_S``). The profiler's estimate for a 0.1M-parameter model is microseconds, where the
fixed cost of every phase switch dominates the SLO check: at SLO 3 a third job would then never be
admitted beside two others, and would wait for one of them to finish."""

SLO = 4.0
"""The harness jobs run veRL's hybrid engine, so each registers co-located on the training pool, and
three of them take turns on one training node for every phase: each runs at about a third of its solo
speed, so SLO 4 (with the phase-switch cost) admits all three in one group."""


def opt_in(cluster: LocalCluster, name: str, *, slo: float = SLO) -> dict[str, str]:
    """The variables a platform sets for an opted-in job on this machine: the node's sidecar socket (and
    the rollout pool's, both pools being on this host), the job's name, SLO and solo phase times, the
    phase log. No token: the job registers through the sidecar."""
    return {env.SIDECAR_SOCKET: cluster.sockets["train"], adapter_env.ROLLOUT_SIDECAR_SOCKET: cluster.sockets["rollout"],
            env.EVENT_LOG: str(cluster.events), env.JOB: name, adapter_env.SLO: str(slo), adapter_env.PHASE_S: PHASE_S}


def redis_available() -> bool:
    return shutil.which("redis-server") is not None or Path("/usr/bin/redis-server").exists()


def phases(cluster_events: Path) -> list[dict[str, Any]]:
    from job import read_jsonl

    return [r for r in read_jsonl(cluster_events) if r.get("owner")]
