"""Real ROLL jobs on this machine, solo or multiplexed through real RollMux services.

Used by the ROLL adapter tests and ``benchmarks/roll_cpu.py``. A job is the CPU harness
(``harness/run_rlvr.py`` / ``harness/run_agentic.py``) run by ``.venv-roll/bin/python`` (ROLL needs
numpy<2, transformers 4.57 and ray 2.48, so it cannot share the main venv). :class:`Pools` starts
a redis-server, a coordinator on it, and one sidecar per pool (a rollout node and a training node,
one GPU each, as the shim sees them): opted-in jobs register through the training sidecar and take
their rollout permits through the rollout one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollmux.core.ports import free_port
from rollmux.shim import env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
HARNESS = HERE / "harness"
ROLL_VENV = REPO / ".venv-roll"
ROLL_PY = ROLL_VENV / "bin" / "python"
REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"
VOLATILE = ("time/", "tps", "memory", "/mem", "timer", "lr")
"""Metric name parts that measure wall time, throughput or memory (differ between any two runs)."""
PHASE_S = "3,2"
"""Solo rollout and train seconds of a harness job on this CPU, as a user declares them from a run alone
(``ROLLMUX_PHASE_S``). The profiler's estimate for these tiny models is microseconds, where the fixed
cost of every phase switch dominates the SLO check, so that jobs beside two or three others would never
be admitted and would wait for one of them to finish."""
SLO = "5.0"
"""The harness jobs' SLO. Their actor_infer shares actor_train's GPU, so each registers co-located on
the training pool, and four of them take turns on one training node for every phase: each runs at
about a quarter of its solo speed, so SLO 5 (with the phase-switch cost) admits all four in one group."""


def roll_unavailable() -> str | None:
    """Why ROLL cannot be imported here (None when it can)."""
    if not ROLL_PY.exists():
        return f"{ROLL_PY} is missing: run `bash scripts/setup.sh --dev` (it calls scripts/setup_roll.sh)"
    probe = subprocess.run([str(ROLL_PY), "-c", "import roll, rollmux.adapters.roll"], capture_output=True, text=True,
                           timeout=300)
    if probe.returncode != 0:
        return f"`import roll` fails in {ROLL_VENV}: {probe.stderr.strip().splitlines()[-1:]}"
    return None


@dataclass
class Pools:
    """redis-server + coordinator + a rollout-node and a training-node sidecar, in this process."""

    workdir: Path
    lease_ttl_s: float = 5.0
    redis: subprocess.Popen[bytes] | None = None
    parts: list[Any] = field(default_factory=list)
    sockdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rmxr-")))

    def start(self) -> Pools:
        from rollmux.coordinator.service.runtime.api import ServiceConfig
        from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
        from rollmux.core.model import ClusterSpec, Pool

        port = free_port()
        self.redis = subprocess.Popen([REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--dir", str(self.workdir)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        _wait_port(port)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.coordinator = ThreadedServer(ServerOptions(
            redis_url=self.redis_url, http=None, cluster=ClusterSpec(gpus_per_node=1),
            config=ServiceConfig(lease_ttl_s=self.lease_ttl_s, reap_interval_s=0.05, heartbeat_interval_s=0.2)))
        assert self.coordinator.wait_ready(30), "coordinator did not start"
        self.sockets: dict[str, str] = {}
        for node, pool in (("r0", Pool.ROLLOUT), ("t0", Pool.TRAIN)):
            self.sockets[pool.value] = self.add_node(node, pool)
        return self

    def add_node(self, node: str, pool: Any) -> str:
        """Start one more sidecar (`node` of `pool`, a ``rollmux.core.model.Pool``, one GPU); its socket path."""
        from rollmux.sidecar.agent import AgentConfig, NodeAgent
        from rollmux.sidecar.gpu import NoGpuProvider
        from rollmux.sidecar.server import serve
        from rollmux.wire.client import CoordinatorClient

        gpu = "H20" if pool.value == "rollout" else "H800"
        agent = NodeAgent(AgentConfig(node_id=node, pool=pool, heartbeat_s=0.2,
                                      event_log=str(self.workdir / f"{node}-events.jsonl")),
                          CoordinatorClient(self.coordinator.address, retry_s=5.0), NoGpuProvider(gpu, 1)).start()
        assert agent.wait_connected(30), f"sidecar {node} did not connect"
        path = str(self.sockdir / f"{node}.sock")
        self.parts.append((agent, serve(agent, path)))
        return path

    def job_env(self, event_log: Path) -> dict[str, str]:
        """What the platform sets in an opted-in job's environment: the sockets, the SLO and the solo phase
        times a user declares from a run alone (``PHASE_S``)."""
        return {env.SIDECAR_SOCKET: self.sockets["train"], "ROLLMUX_ROLLOUT_SIDECAR_SOCKET": self.sockets["rollout"],
                env.EVENT_LOG: str(event_log), "ROLLMUX_SLO": SLO, "ROLLMUX_PHASE_S": PHASE_S}

    def stop(self) -> None:
        for agent, server in self.parts:
            server.stop(0)
            agent.stop()
        self.coordinator.stop()
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(10)
        shutil.rmtree(self.sockdir, ignore_errors=True)


def _wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


@dataclass
class Job:
    """One running ROLL job (a driver process and its private Ray instance)."""

    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    log: Path

    def wait(self, timeout_s: float = 600) -> dict[str, Any]:
        """Wait for the driver; returns {"rc", "log_tail", and the harness's JSON (steps, workers, ...)}."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.wait(30)
        result: dict[str, Any] = {"rc": rc, "log_tail": self.log.read_text(errors="replace")[-4000:]}
        if self.out.exists():
            result.update(json.loads(self.out.read_text()))
        return result


    def kill(self) -> None:
        """SIGKILL the whole job: its driver and every process of its private Ray (one session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def leftovers(self) -> list[int]:
        """Processes still alive in the job's session (none once the job is gone)."""
        return session_pids(self.proc.pid)


def session_pids(sid: int) -> list[int]:
    """Pids whose session id is `sid` (zombies excluded)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                pids.append(int(stat.parent.name))
    return pids


def build_assets(workdir: Path) -> Path:
    """The tiny model, tokenizer and data every job of a test shares (built once, before any job)."""
    subprocess.run([str(ROLL_PY), str(HARNESS / "assets.py"), str(workdir / "assets")], check=True, timeout=300,
                   env={**os.environ, "PYTHONPATH": str(HARNESS)}, capture_output=True)
    return workdir / "assets"


_PORT_BLOCKS = itertools.count()


def launch(name: str, workdir: Path, *, kind: str = "rlvr", steps: int = 2, lr: float = 1e-3,
           extra_env: dict[str, str] | None = None, start_file: Path | None = None, timing: bool = False,
           disaggregated: bool = False, check_weights: bool = False, step_gate: Path | None = None,
           extra_args: list[str] | None = None) -> Job:
    """Start one job's driver. `kind` is "rlvr" or "agentic"; `extra_env` opts it in (``Pools.job_env``);
    with `start_file`, the job waits once built until the caller creates that file (after :func:`wait_built`); with
    `timing`, its result also holds spans, offload/load seconds and permit calls (``harness/timing.py``); with
    `step_gate` (and `timing`), it pauses after each step k until ``step_gate/go-{k+1}`` exists; `extra_args`
    go to the harness script as they are (``--ray-address``, ``--nodes``)."""
    jobdir = workdir / name
    jobdir.mkdir(parents=True, exist_ok=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(HARNESS), "PATH": f"{ROLL_VENV / 'bin'}:{e.get('PATH', '')}", "OMP_NUM_THREADS": "1",
              "RAY_DEDUP_LOGS": "0", "TOKENIZERS_PARALLELISM": "false",
              # ROLL reserves half a node's CPUs per placement group and asks a whole CPU per task: give
              # the job's private Ray (started by the adapter, or by the harness) more logical CPUs than 2
              "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 16, "GPU": 2 if disaggregated else 1}),
              "RMX_PORT_BLOCK": str(next(_PORT_BLOCKS))})  # cpu_patches._patch_ports: no two jobs pick one port
    e.update(extra_env or {})
    out, log = workdir / f"{name}.json", workdir / f"{name}.log"
    cmd = [str(ROLL_PY), str(HARNESS / f"run_{kind}.py"), "--assets", str(workdir / "assets"), "--workdir",
           str(jobdir), "--out", str(out), "--steps", str(steps), "--name", name, "--lr", str(lr)]
    if start_file is not None:
        cmd += ["--start-file", str(start_file)]
    if timing:
        cmd.append("--timing")
    if step_gate is not None:
        cmd += ["--step-gate", str(step_gate)]
    if disaggregated:
        cmd.append("--disaggregated")
    if check_weights:
        cmd.append("--check-weights")
    cmd += extra_args or []
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=jobdir, env=e, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return Job(name=name, proc=proc, out=out, log=log)


def wait_built(jobs: list[Job], timeout_s: float = 600) -> None:
    """Wait until every job is built and waits on its start file; RuntimeError naming the logs if one exits first."""
    deadline = time.monotonic() + timeout_s
    while not all(j.out.with_suffix(".built").exists() for j in jobs):
        dead = [j.name for j in jobs if j.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"jobs {dead or 'all'} did not get built: see {[str(j.log) for j in jobs]}")
        time.sleep(0.2)


def stable_metrics(step: dict[str, Any]) -> dict[str, float]:
    """A step's metrics without the wall-time, throughput and memory ones."""
    return {k: float(v) for k, v in step.items()
            if isinstance(v, (int, float)) and not any(p in k for p in VOLATILE)}


def metric_mismatches(a: list[dict[str, Any]], b: list[dict[str, Any]], *, rel: float = 1e-5,
                      abs_tol: float = 1e-6) -> list[str]:
    """Differences between two runs' per-step metrics (empty when they agree within float tolerance)."""
    if len(a) != len(b):
        return [f"{len(a)} steps vs {len(b)} steps"]
    bad = []
    for i, (sa, sb) in enumerate(zip(a, b)):
        ma, mb = stable_metrics(sa), stable_metrics(sb)
        if ma.keys() != mb.keys():
            bad.append(f"step {i}: metric names differ: {sorted(ma.keys() ^ mb.keys())[:5]}")
        for k in sorted(ma.keys() & mb.keys()):
            x, y = ma[k], mb[k]
            if not (math.isclose(x, y, rel_tol=rel, abs_tol=abs_tol) or (math.isnan(x) and math.isnan(y))):
                bad.append(f"step {i}: {k} {x!r} != {y!r}")
    return bad


def phase_records(event_log: Path) -> list[dict[str, Any]]:
    """The shim's per-phase records of every opted-in job (owner ranks only: the permit holders)."""
    if not event_log.exists():
        return []
    rows = [json.loads(line) for line in event_log.read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if r.get("owner")), key=lambda r: r["t_start"])


def overlaps_on_a_node(records: list[dict[str, Any]]) -> list[str]:
    """Pairs of phases of different jobs that held the same node at the same time (must be none)."""
    bad = []
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            if a["node"] == b["node"] and a["job"] != b["job"] and b["t_start"] < a["t_end"] - 1e-3:
                bad.append(f"{a['job']} {a['phase']}({a['iteration']}) and {b['job']} {b['phase']}({b['iteration']}) "
                           f"on {a['node']}")
    return bad
