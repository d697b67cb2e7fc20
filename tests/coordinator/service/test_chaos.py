"""Chaos: SIGKILL the coordinator, a job and a sidecar, restart Redis, mid-run; then check the event log.

Short form by default (4 jobs, 6 iterations, one round of faults). ROLLMUX_CHAOS_LONG=1 runs 8 jobs,
30 iterations and ROLLMUX_CHAOS_ROUNDS rounds (default 4) of faults.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rollmux.coordinator.service.client import CoordinatorClient

from .conftest import CoordinatorProcess, RedisProcess, job_spec

LONG = os.environ.get("ROLLMUX_CHAOS_LONG") == "1"
N_JOBS = 8 if LONG else 4
ITERATIONS = 30 if LONG else 6
ROUNDS = int(os.environ.get("ROLLMUX_CHAOS_ROUNDS", "4")) if LONG else 1
WORKER = str(Path(__file__).with_name("chaos_worker.py"))
PY = sys.executable


Coordinator = CoordinatorProcess


def released_count(log: Path) -> int:
    return sum(" released " in line for line in log.read_text().splitlines()) if log.exists() else 0


def wait_progress(log: Path, more: int, procs: dict, timeout: float = 60) -> None:
    target = released_count(log) + more
    deadline = time.monotonic() + timeout
    while released_count(log) < target and time.monotonic() < deadline:
        if all(p.poll() is not None for p in procs.values()):
            return
        time.sleep(0.02)


def kill_job_mid_phase(log: Path, name: str, procs: dict, spawn) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [ln for ln in log.read_text().splitlines() if f" {name} " in ln or ln.endswith(f" {name}")]
        if procs[name].poll() is not None:
            return
        if lines and lines[-1].split()[1] == "start":
            procs[name].send_signal(signal.SIGKILL)
            procs[name].wait()
            with open(log, "a") as f:
                f.write(f"{time.time():.6f} killed {name}\n")
            time.sleep(0.2)
            procs[name] = spawn(name)
            return
        time.sleep(0.003)


def check_log(log: Path, names: list[str]) -> dict[str, int]:
    """Mutual exclusion per node, on-policy order per job, every job done."""
    open_: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
    intervals: dict[str, list[tuple[float, float, str, int]]] = defaultdict(list)
    released: dict[str, list[tuple[str, int]]] = defaultdict(list)
    done = set()
    for line in log.read_text().splitlines():
        parts = line.split()
        t, kind = float(parts[0]), parts[1]
        if kind == "killed":
            for key in [k for k in open_ if k[0] == parts[2]]:
                start, nodes = open_.pop(key)
                for n in nodes:
                    intervals[n].append((start, t, key[0], key[1]))
        elif kind == "done":
            done.add(parts[2])
        elif kind in ("start", "end", "lost", "released"):
            job, phase, it, epoch, nodes = parts[2], parts[3], int(parts[4]), int(parts[5]), tuple(parts[6].split(","))
            if kind == "start":
                open_[(job, epoch)] = (t, nodes)
            elif kind in ("end", "lost"):
                start, held = open_.pop((job, epoch))
                for n in held:
                    intervals[n].append((start, t, job, epoch))
            else:
                released[job].append((phase, it))
    assert not open_, f"phases started but never ended: {open_}"
    for node, ivs in intervals.items():
        ivs.sort()
        max_end, max_job = -1.0, ""
        for start, end, job, epoch in ivs:
            assert not (start < max_end and job != max_job), (
                f"mutual exclusion violated on {node}: {job} (epoch {epoch}) started at {start:.6f} while "
                f"{max_job} held it until {max_end:.6f}")
            if end > max_end:
                max_end, max_job = end, job
    for job in names:
        expected = [(ph, i) for i in range(ITERATIONS) for ph in ("rollout", "train", "sync")]
        assert released[job] == expected, f"{job}: phases lost, repeated or out of order: {released[job]}"
    assert done == set(names), f"jobs not finished: {set(names) - done}"
    return {n: len(v) for n, v in intervals.items()}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chaos_sigkill_coordinator_job_sidecar_and_redis_restart(redis_server: RedisProcess, tmp_path: Path) -> None:
    coord = Coordinator(redis_server.url, tmp_path)
    coord.start()
    client = CoordinatorClient(coord.address, retry_s=30)
    n_groups = (N_JOBS + 1) // 2

    def spawn_nodes(pool: str, nodes: list[str]) -> subprocess.Popen[bytes]:  # their sidecars' streams
        return subprocess.Popen([PY, WORKER, "sidecar", "--coordinator", coord.address, "--pool", pool,
                                 *(a for n in nodes for a in ("--node", n))])

    sidecar = spawn_nodes("rollout", ["r0"])
    others = [spawn_nodes("rollout", [f"r{i}" for i in range(1, 2 * n_groups)]),
              spawn_nodes("train", [f"t{i}" for i in range(n_groups)])]
    try:  # a failed setup must not leave the coordinator process behind
        deadline = time.monotonic() + 30
        while sum(n.state == "ready" for n in client.cluster_state().nodes) < 3 * n_groups:
            assert time.monotonic() < deadline, "node streams did not connect"
            time.sleep(0.05)
        names = [f"j{i}" for i in range(N_JOBS)]
        tokens = {n: client.register_job(job_spec(n, nr=16 if i % 2 == 0 else 8)).token for i, n in enumerate(names)}
        groups = {j.group_id for j in client.cluster_state().jobs}
        assert len(groups) < N_JOBS  # jobs share nodes, so mutual exclusion is exercised
    except BaseException:
        coord.kill()
        client.close()
        for p in [sidecar, *others]:
            p.kill()
        raise
    log = tmp_path / "events.log"

    def spawn(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([PY, WORKER, "job", "--coordinator", coord.address, "--job", name,
                                 f"--token={tokens[name]}", "--iterations", str(ITERATIONS), "--log", str(log)])

    def spawn_sidecar() -> subprocess.Popen[bytes]:
        return spawn_nodes("rollout", ["r0"])

    procs = {n: spawn(n) for n in names}
    try:
        for rnd in range(ROUNDS):
            wait_progress(log, 6, procs)
            coord.kill()  # 1. coordinator SIGKILL mid-run, restarted from Redis
            time.sleep(0.3)
            coord.start()
            wait_progress(log, 6, procs)
            kill_job_mid_phase(log, names[(1 + rnd) % N_JOBS], procs, spawn)  # 2. a job dies holding a permit
            wait_progress(log, 4, procs)
            sidecar.send_signal(signal.SIGKILL)  # 3. the sidecar of r0 dies and comes back
            sidecar.wait()
            time.sleep(0.3)
            sidecar = spawn_sidecar()
            wait_progress(log, 4, procs)
            redis_server.stop()  # 4. Redis restarts (append-only file keeps the state)
            time.sleep(0.3)
            redis_server.start()
        deadline = time.monotonic() + 240
        for name, p in procs.items():
            rc = p.wait(max(1.0, deadline - time.monotonic()))
            assert rc == 0, f"job {name} exited with {rc}"
        per_node = check_log(log, names)
        state = client.cluster_state()
        assert all(j.next_iteration == ITERATIONS for j in state.jobs)
        print(f"\nchaos: {N_JOBS} jobs x {ITERATIONS} iterations, {ROUNDS} round(s) of faults, "
              f"{coord.starts} coordinator starts; phases per node: {per_node}")
    finally:
        for p in [*procs.values(), sidecar, *others]:
            if p.poll() is None:
                p.kill()
                p.wait()
        if coord.proc and coord.proc.poll() is None:
            coord.kill()
        client.close()
