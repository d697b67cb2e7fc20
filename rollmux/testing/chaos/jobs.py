"""Job slots of a chaos run: each slot keeps one job running, run after run, through the faults.

A *shim* slot runs a job as two rank processes (rollout rank on its rollout node's sidecar, training
rank on its training node's sidecar). A dead rank aborts the job (the sidecar deregisters it), so
the slot kills the other rank, makes sure the job is gone and registers the next run. A *direct*
slot runs the job as one coordinator client process; a dead one is started again and resumes the
same run from the coordinator's cursor.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollmux.shim import env
from rollmux.testing.chaos.deployment import Deployment


def append_event(path: Path, ev: str, *, t: float | None = None, **fields: Any) -> None:
    """One harness event line in the shared log (O_APPEND, one write); `t`: when it happened (default now)."""
    rec = {"t": round(time.time() if t is None else t, 6), "ev": ev, **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


class EventTail:
    """Reads the shared log as it grows; thread-safe view of every event and each process's last."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""
        self.events: list[dict[str, Any]] = []
        self.last: dict[int, dict[str, Any]] = {}  # pid -> its latest event
        self.lock = threading.Lock()

    def poll(self) -> None:
        with self.lock:
            if not self.path.exists():
                return
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                ev = json.loads(line)
                self.events.append(ev)
                if "pid" in ev and ev["ev"] != "killed":
                    self.last[ev["pid"]] = ev

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)


@dataclass(slots=True, kw_only=True)
class Run:
    """One registration of a slot's job and its processes."""

    name: str
    token: str
    kind: str  # "shim" | "direct"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # role -> process
    started: bool = False  # its processes were launched
    outcome: bool | None = None  # True completed, False aborted by a fault, None still going


@dataclass(slots=True, kw_only=True)
class Slot:
    name: str
    kind: str
    runs: list[Run] = field(default_factory=list)

    @property
    def current(self) -> Run | None:
        return self.runs[-1] if self.runs and self.runs[-1].outcome is None else None


class Jobs:
    """Keeps every slot's job running; `step` is called in a loop by the scenario.

    Args:
        deploy: the running deployment.
        log: the shared event log.
        slots: (shim slots, direct slots).
        iterations: iterations of each run; phase_s: how long a phase body sleeps.
    """

    def __init__(self, deploy: Deployment, log: Path, *, shim: int, direct: int, iterations: int,
                 phase_s: float) -> None:
        from rollmux.wire.client import CoordinatorClient

        self.deploy, self.log, self.iterations, self.phase_s = deploy, log, iterations, phase_s
        self.slots = [Slot(name=f"s{i}", kind="shim") for i in range(shim)]
        self.slots += [Slot(name=f"d{i}", kind="direct") for i in range(direct)]
        self.op = CoordinatorClient(deploy.address.split(","), token=deploy.operator_token, retry_s=2.0)
        self.lock = threading.Lock()  # held while the process table changes (the fault injector kills from it)

    # ------------------------------------------------------------------------------ per loop
    def step(self, *, open_: bool) -> None:
        """Supervise every slot once; `open_`: new runs may still start after a completed one."""
        for slot in self.slots:
            run = slot.current
            if run is None:
                if open_ or not slot.runs or slot.runs[-1].outcome is False:  # an aborted run is run again
                    self._register(slot)
                continue
            if not run.started:
                self._launch(run)
            else:
                self._supervise(run)

    def finished(self) -> bool:
        return all(s.runs and s.runs[-1].outcome is True for s in self.slots)

    def outcomes(self) -> dict[str, bool]:
        return {r.name: bool(r.outcome) for s in self.slots for r in s.runs if r.started}

    def unfinished(self) -> list[str]:
        return [s.name for s in self.slots if not (s.runs and s.runs[-1].outcome is True)]

    def live(self) -> list[tuple[Run, str, subprocess.Popen[bytes]]]:
        """(run, role, process) of every running job process."""
        return [(r, role, p) for s in self.slots for r in s.runs if r.outcome is None
                for role, p in r.procs.items() if p.poll() is None]

    # -------------------------------------------------------------------------- registration
    def _register(self, slot: Slot) -> None:
        from rollmux.core.model import JobSpec
        from rollmux.wire.errors import AlreadyExistsError, ServiceError

        name = f"{slot.name}-{len(slot.runs)}"
        # 1 MiB of cached state: placement does not depend on this machine's free host memory
        spec = JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=100.0, t_train_s=100.0, slo=2.0,
                       rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)
        try:  # the nonce makes a retry after a lost answer idempotent
            job = self.op.register_job(spec, nonce=f"chaos-{name}-{self.deploy.secret}")
        except AlreadyExistsError:
            raise
        except ServiceError:
            return  # the coordinator is down or not ready: next step tries again
        slot.runs.append(Run(name=name, token=job.token, kind=slot.kind))

    def _launch(self, run: Run) -> None:
        """Start the run's processes once it is admitted and its nodes' sidecars serve."""
        from rollmux.wire.errors import ServiceError

        if run.kind == "direct":
            self._spawn(run, "direct")
            run.started = True
            return
        try:
            info = self.op.job(run.name, run.token).status()
        except ServiceError:
            return
        if info.state != "admitted" or not info.rollout_nodes or not info.train_nodes:
            return
        nodes = {"rollout": info.rollout_nodes[0], "train": info.train_nodes[0]}
        if not all(self.deploy.sidecars[n].ready() for n in nodes.values()):
            return
        with self.lock:
            for role, node in nodes.items():
                self._spawn(run, role, socket=self.deploy.sidecars[node].socket)
            run.started = True

    def _spawn(self, run: Run, role: str, socket: str = "") -> None:
        e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
        e[env.JOB_TOKEN] = run.token  # in the environment, never on a command line
        common = ["--iterations", str(self.iterations), "--log", str(self.log), "--phase-s", str(self.phase_s)]
        if role == "direct":
            argv = ["direct", "--coordinator", self.deploy.address, "--job", run.name, *common]
        else:
            e.update({env.SIDECAR_SOCKET: socket, env.JOB: run.name})
            argv = ["shim", "--role", role, *common]
        out = open(self.deploy.dir / f"{run.name}-{role}.log", "ab")  # noqa: SIM115 - the child's
        run.procs[role] = subprocess.Popen([sys.executable, "-m", "rollmux.testing.chaos.rank", *argv], env=e, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    # ----------------------------------------------------------------------------- supervision
    def _supervise(self, run: Run) -> None:
        with self.lock:
            codes = {role: p.poll() for role, p in run.procs.items()}
            if run.kind == "direct":
                if codes["direct"] == 0:
                    run.outcome = True
                elif codes["direct"] is not None:
                    self._spawn(run, "direct")  # resumes from the coordinator's cursor
                return
            if all(c == 0 for c in codes.values()):
                run.outcome = True
            elif any(c not in (None, 0) for c in codes.values()):
                for p in run.procs.values():
                    if p.poll() is None:
                        self.kill(run, p)
                run.outcome = False
        if run.outcome is False:
            self._forget(run)

    def kill(self, run: Run, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL one of `run`'s processes and record it (its open phase ends now). Hold `lock`."""
        # The interval ends when the signal is sent: the next holder can start only once the node's
        # sidecar has seen the process die, which is after the send. Read after the send, this thread
        # may be descheduled first on a loaded machine and stretch the interval over the next holder's
        # start (a 0.26 ms false overlap in one CI-like run); the wait below may return later still.
        t = time.time()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        append_event(self.log, "killed", t=t, run=run.name, pid=proc.pid)

    def _forget(self, run: Run) -> None:
        """An aborted run must be gone at the coordinator before its slot moves on."""
        from rollmux.wire.errors import NotFoundError, PermissionDeniedError, ServiceError

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.op.job(run.name, run.token).deregister()
                return
            except (NotFoundError, PermissionDeniedError):
                return  # a sidecar deregistered it already
            except ServiceError:
                time.sleep(0.2)

    def dump_state(self) -> Path:
        """Write the coordinator's view (jobs, permits, nodes) next to the logs, for a stuck run."""
        from rollmux.wire import convert
        from rollmux.wire.client import CoordinatorClient
        from rollmux.wire.errors import ServiceError

        path = self.deploy.dir / "cluster-state.json"
        leader = self.deploy.leader()  # a standby answers with an empty state
        client = CoordinatorClient(leader.address if leader else self.deploy.address.split(","),
                                   token=self.deploy.operator_token, retry_s=2.0)
        try:
            path.write_text(json.dumps(convert.cluster_info_to_dict(client.cluster_state()), indent=2))
        except ServiceError as exc:
            path.write_text(json.dumps({"error": str(exc)}))
        finally:
            client.close()
        return path

    def stop(self) -> None:
        with self.lock:
            for run, _, p in self.live():
                self.kill(run, p)
        self.op.close()
