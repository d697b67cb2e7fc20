"""Start a whole single-machine RollMux setup as real processes: an embedded coordinator, one
sidecar per pool (each pinned to its pool's CPU core) and tiny GRPO jobs whose rank processes are
pinned to their node's core. Used by ``rollmux demo``, ``benchmarks/multiplex_cpu.py`` and the
end-to-end test. Every child runs in its own session and is terminated on exit, error or Ctrl-C.

Children run the installed package (``python -m rollmux ...``) with the work folder as their working
directory, and every path handed to them is absolute, so the caller's directory does not matter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollmux.core.errors import RollMuxError
from rollmux.core.ports import free_port
from rollmux.shim import env


class LaunchError(RollMuxError):
    """A child process of the local setup failed to start or exited with an error (its log is named)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobKnobs:
    """One tiny GRPO job: its name and the ``rollmux.demo.tiny_grpo`` knobs that set its phase ratio."""

    name: str
    iterations: int
    flags: tuple[str, ...] = ()  # extra JobConfig flags, e.g. ("--max-new-tokens", "24")
    seed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Pools:
    """CPU cores of the two pools (one node each)."""

    rollout_cpu: int = 0
    train_cpu: int = 1


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e["OMP_NUM_THREADS"] = "1"
    e.update(extra or {})
    return e


@dataclass(slots=True)
class Procs:
    """Child processes, terminated together (SIGTERM, then SIGKILL) when the block ends."""

    cwd: Path  # working directory of every child (absolute)
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(self, name: str, argv: Sequence[str], *, log: Path, cpus: set[int] | None = None,
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen([sys.executable, *argv], cwd=self.cwd, env=_child_env(extra_env), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(proc.pid, cpus)
        self.children.append((name, proc))
        return proc

    def terminate(self, procs: Sequence[subprocess.Popen[bytes]] | None = None, grace_s: float = 5.0) -> None:
        targets = [p for _, p in self.children if procs is None or p in procs]
        for p in targets:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in targets:
            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()


@dataclass(slots=True)
class RunningJob:
    """A launched job's two rank processes and its files."""

    knobs: JobKnobs
    trainer: subprocess.Popen[bytes]
    rollout: subprocess.Popen[bytes]
    log_file: Path  # trainer JSON lines (one per iteration)
    started: float  # wall time of the launch

    def poll(self) -> int | None:
        """None while running; else the worst exit code of the two ranks."""
        codes = [self.trainer.poll(), self.rollout.poll()]
        if any(c is None for c in codes):
            if any(c not in (None, 0) for c in codes):
                return max(c for c in codes if c is not None)
            return None
        return max(c for c in codes if c is not None)

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.log_file)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


class LocalCluster:
    """Embedded coordinator + a rollout-pool and a train-pool sidecar, all on this machine.

    Args:
        workdir: where sockets, logs and event records go.
        pools: the CPU core of each pool.
        fill_saturated: let the placement policy pack into a saturated group while every SLO holds
            (the demo packs three jobs onto one node per pool).
        lease_ttl_s: run-permit lease TTL.
        sidecar_flags: extra ``rollmux sidecar`` flags of both sidecars (default: NVML off; the GPU check
            turns it on, or points the memory check at its stand-in directory).
        redis_url: keep the coordinator's state in this Redis (None: the embedded store).
        secret: the coordinator's bootstrap secret (None: node and operator calls are open). Set, it is
            written to ``workdir/secret`` (mode 0600) and each sidecar reads it with ``--secret-file``
            (as the Helm chart mounts it), so a job can register only through its node's sidecar.
    """

    def __init__(self, workdir: Path, *, pools: Pools | None = None, fill_saturated: bool = False,
                 lease_ttl_s: float = 10.0, redis_url: str | None = None, secret: str | None = None,
                 sidecar_flags: Sequence[str] = ("--no-nvml",)) -> None:
        self.dir, self.pools, self.redis_url, self.secret = workdir.resolve(), pools or Pools(), redis_url, secret
        self.sidecar_flags = tuple(sidecar_flags)
        self.fill_saturated, self.lease_ttl_s = fill_saturated, lease_ttl_s
        self.procs = Procs(cwd=self.dir)
        self.server: Any = None
        self.client: Any = None
        self.sockets: dict[str, str] = {}
        self.events = self.dir / "phases.jsonl"
        self.node_events = self.dir / "nodes.jsonl"

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> LocalCluster:
        from rollmux.coordinator.policy import RollMuxPolicy
        from rollmux.coordinator.service.runtime.api import ServiceConfig
        from rollmux.coordinator.service.runtime.state import live_policy_config
        from rollmux.coordinator.service.server import ServerOptions, start_in_thread
        from rollmux.core.model import ClusterSpec
        from rollmux.wire.auth import operator_token
        from rollmux.wire.client import CoordinatorClient

        self.dir.mkdir(parents=True, exist_ok=True)
        auth_flags = self._write_secret()
        config = ServiceConfig(lease_ttl_s=self.lease_ttl_s)
        self.server = start_in_thread(ServerOptions(
            listen="127.0.0.1:0", http=None, cluster=ClusterSpec(gpus_per_node=1, host_dram_bytes=1 << 40),
            config=config, redis_url=self.redis_url, secret=self.secret))
        if not self.server.wait_ready(30.0):
            raise LaunchError("the embedded coordinator did not become ready within 30s")
        if self.fill_saturated:
            # The embedded store never reloads, so the runtime built at start keeps this policy.
            live = dataclasses.replace(live_policy_config(config), fill_saturated=True)
            self.server.core.rt.state.policy = RollMuxPolicy(live)
        self.client = CoordinatorClient(self.server.address,
                                        token=operator_token(self.secret) if self.secret else None)
        sock_dir = Path(tempfile.mkdtemp(prefix="rmx-"))  # short path: sun_path is 107 bytes
        for node, pool, cpu in (("rollout-0", "rollout", self.pools.rollout_cpu),
                                ("train-0", "train", self.pools.train_cpu)):
            path = str(sock_dir / f"{pool}.sock")
            ready = self.dir / f"{node}.ready"
            self.procs.spawn(node, ["-m", "rollmux", "sidecar", "--coordinator", self.server.address,
                                    "--node-id", node, "--pool", pool, "--socket", path, *self.sidecar_flags,
                                    "--event-log", str(self.node_events), "--ready-file", str(ready), *auth_flags],
                             log=self.dir / f"{node}.log", cpus={cpu})
            self.sockets[pool] = path
        deadline = time.monotonic() + 120
        for node in ("rollout-0", "train-0"):
            while not (self.dir / f"{node}.ready").exists():
                if time.monotonic() > deadline or any(p.poll() is not None for _, p in self.procs.children):
                    raise LaunchError(f"sidecar {node} did not come up; see {self.dir / (node + '.log')}")
                time.sleep(0.05)
        return self

    def _write_secret(self) -> list[str]:
        """Write the bootstrap secret for the sidecars (owner-only); their flags (none without one)."""
        if not self.secret:
            return []
        path = self.dir / "secret"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, self.secret.encode())
        finally:
            os.close(fd)
        return ["--secret-file", str(path)]

    def stop(self) -> None:
        self.procs.terminate()
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.stop()
        for path in self.sockets.values():
            with contextlib.suppress(OSError):
                os.unlink(path)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------ jobs
    def register(self, knobs: JobKnobs, *, t_roll_s: float, t_train_s: float, slo: float) -> str:
        """Register the job at the coordinator (times: measured solo phases); returns its token."""
        from rollmux.core.model import JobSpec

        spec = JobSpec(name=knobs.name, n_rollout_gpus=1, n_train_gpus=1, slo=slo, model_params_b=0.001,
                       max_tokens=64, batch_size=128, rollout_state_bytes=1 << 20, train_state_bytes=1 << 20,
                       t_roll_s=max(t_roll_s, 1e-3), t_train_s=max(t_train_s, 1e-3))
        return str(self.client.register_job(spec).token)

    def launch(self, knobs: JobKnobs, token: str | None, *, tag: str = "") -> RunningJob:
        """Start the job's trainer (train core) and rollout worker (rollout core); gated when `token`."""
        return launch_job(self.procs, self.dir, knobs, self.pools, token=token, sockets=self.sockets,
                          events=self.events, tag=tag)

    def admitted(self, name: str) -> bool:
        return bool(self.client.cluster_state() and any(j.job == name and j.state == "admitted"
                                                        for j in self.client.cluster_state().jobs))


def launch_job(procs: Procs, workdir: Path, knobs: JobKnobs, pools: Pools, *, token: str | None = None,
               sockets: dict[str, str] | None = None, events: Path | None = None, tag: str = "") -> RunningJob:
    """Start both ranks of one tiny GRPO job (ungated when `token` is None)."""
    init = f"tcp://127.0.0.1:{free_port()}"
    log = workdir / f"{knobs.name}{tag}.jsonl"
    if log.exists():
        log.unlink()
    common = ["-m", "rollmux.demo.tiny_grpo.rollmux_rank", "--init-method", init, "--job-id", knobs.name,
              "--iterations", str(knobs.iterations), "--seed", str(knobs.seed), *knobs.flags]
    ranks = {}
    for rank, pool, cpu in ((0, "train", pools.train_cpu), (1, "rollout", pools.rollout_cpu)):
        extra = {}
        if token is not None:
            assert sockets is not None
            extra = {env.SIDECAR_SOCKET: sockets[pool], env.JOB: knobs.name, env.JOB_TOKEN: token,
                     env.RANK: str(rank)}
            if events is not None:
                extra[env.EVENT_LOG] = str(events)
        argv = [*common, "--rank", str(rank), "--cpus", str(cpu)]
        if rank == 0:
            argv += ["--log-file", str(log)]
        ranks[rank] = procs.spawn(f"{knobs.name}{tag}-r{rank}", argv, log=workdir / f"{knobs.name}{tag}-r{rank}.log",
                                  cpus={cpu}, extra_env=extra)
    return RunningJob(knobs=knobs, trainer=ranks[0], rollout=ranks[1], log_file=log, started=time.time())


@contextlib.contextmanager
def interrupt_safe() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so `finally` blocks clean up children either way."""
    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
