"""A veRL GRPO job with ``trainer.nnodes=2`` (one fake GPU per node) on the multi-node Ray cluster, through
the CPU harness of ``tests/adapters/verl/harness``.

The driver connects to the cluster's head (``ray_kwargs.ray_init.address``: no ``num_cpus`` /
``num_gpus``, which Ray refuses when connecting). Worker processes inherit their environment from
their raylet, not from the driver: :func:`raylet_env` is what every raylet gets for the harness to
load in them, and each node's own sidecar socket comes on top (``deployment.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).resolve().parents[1] / "adapters" / "verl" / "harness"
if str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))

from job import REPO, VerlJob  # noqa: E402
from raynodes import AUTH  # noqa: E402

from rollmux.shim import env  # noqa: E402

_REPLACED = ("trainer.nnodes=", "trainer.n_gpus_per_node=", "+ray_kwargs.ray_init.num_gpus=",
             "ray_kwargs.ray_init.num_cpus=", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=")
"""Single-node overrides of the harness job that a job on an existing multi-node cluster replaces (each
rank gets ``batch / nnodes`` samples, so its micro-batch is that size)."""


def raylet_env(events: Path) -> dict[str, str]:
    """The harness variables for every raylet (so for every worker process): the CPU platform and the
    harness module, gloo on loopback, the harness's own event file."""
    return {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rollmux_verl_cpu",
            "PYTHONPATH": os.pathsep.join([str(HARNESS), str(REPO)]), "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
            "GLOO_SOCKET_IFNAME": "lo", "RMX_HARNESS_EVENTS": str(events)}


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiNodeJob(VerlJob):
    """The harness job on `address` with `nnodes` nodes of one GPU; `opted_out` keeps RollMux off in its
    workers although their raylets name a sidecar (a solo run on the shared cluster)."""

    address: str = ""  # the cluster's GCS address
    nnodes: int = 2
    opted_out: bool = False

    def environ(self, opt_in: dict[str, str] | None = None) -> dict[str, str]:
        return {**VerlJob.environ(self, opt_in), **AUTH}

    def overrides(self) -> list[str]:
        base = [o for o in VerlJob.overrides(self) if not o.startswith(_REPLACED)]
        micro = max(1, self.batch // self.nnodes)
        out = [*base, f"trainer.nnodes={self.nnodes}", "trainer.n_gpus_per_node=1",
               f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
               f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
               f"+ray_kwargs.ray_init.address={self.address}",
               # TransferQueue pins its storage unit (1 CPU) to the first node by Ray node id; the head has
               # no CPUs, so without this a third of the runs failed with ActorUnschedulableError
               "+transfer_queue.backend.SimpleStorage.required_node_resource=GPU"]
        if self.opted_out:  # the job-level runtime env wins over the raylet's variable: opt-in off
            out.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{env.SIDECAR_SOCKET}=''")
        return out


# ------------------------------------------------------------------------------------------ the side job
SIDE = "sidejob"
KEEP_BYTES = 3 << 30  # what the keeper rank "holds on its GPU" (stand-in bytes), over the per-process limit
FREE_AFTER_S = 1.0  # rollout(0): the keeper frees its memory this long after leaving the phase
KEEP_PAST_S = 5.0  # train(0): the keeper frees it only this long after: past the sidecars' memory wait
MEMORY_WAIT_S = 3.0  # the sidecars' --memory-wait-s in this module
SIDE_SPEC = {"n_rollout_gpus": 2, "n_train_gpus": 2, "t_roll_s": 0.5, "t_train_s": 0.5, "slo": 10.0,
             "rollout_state_bytes": 1 << 20, "train_state_bytes": 1 << 20, "deployment": "colocated-train"}
"""A cheap job of plain shim processes (one rank per GPU node), packed with the veRL job on its nodes."""

SIDE_RANK = r"""
import os, pathlib, threading, time
import rollmux
from rollmux.sidecar.gpu import write_standin_bytes

role, standin, marks = os.environ["RMX_SIDE_ROLE"], os.environ["RMX_STANDIN"], pathlib.Path(os.environ["RMX_MARKS"])
pid = os.getpid()

def hold(nbytes, free_after_s):
    write_standin_bytes(standin, pid, nbytes)
    threading.Timer(free_after_s, lambda: write_standin_bytes(standin, pid, 0)).start()

rollmux.init()
# One iteration, which the round-robin runs between the veRL job's first and second iteration.
with rollmux.phase("rollout", iteration=0):  # the keeper frees its memory after the phase: its node waits for it
    time.sleep(0.3)
    if role == "keeper":
        hold(int(os.environ["RMX_KEEP_BYTES"]), float(os.environ["RMX_FREE_AFTER_S"]))
with rollmux.phase("train", iteration=0):  # the keeper keeps it past the sidecar's memory wait
    time.sleep(0.3)
    if role == "keeper":
        hold(int(os.environ["RMX_KEEP_BYTES"]), float(os.environ["RMX_KEEP_PAST_S"]))
with rollmux.phase("sync", iteration=0):  # the victim is SIGKILLed in here; the keeper finishes it
    (marks / f"{role}.in-sync-0").write_text(str(time.time()))
    time.sleep(600 if role == "victim" else 4.0)
rollmux.shutdown()
"""
"""A rank of the side job: its phases through the shim, the memory its role holds (stand-in bytes),
markers the test waits on."""


@dataclass(slots=True, kw_only=True)
class SideRun:
    """What the side job did, for the assertions."""

    token: str = ""
    pids: dict[str, int] = field(default_factory=dict)  # node -> its rank's pid
    killed_at: float = 0.0  # wall time of the SIGKILL
    rcs: dict[str, int | None] = field(default_factory=dict)  # node -> exit status
    error: str = ""  # why the side job could not run (asserted empty)


def side_rank_env(socket: str, job: str, token: str, role: str, standin: Path, marks: Path,
                  events: Path) -> dict[str, str]:
    """A side rank's environment: its node's sidecar socket and the job's credentials, the scenario knobs."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    return {**base, "PYTHONPATH": str(REPO), env.SIDECAR_SOCKET: socket, env.JOB: job, env.JOB_TOKEN: token,
            env.DEPLOYMENT: "colocated-train", env.EVENT_LOG: str(events), "RMX_SIDE_ROLE": role,
            "RMX_STANDIN": str(standin), "RMX_MARKS": str(marks), "RMX_KEEP_BYTES": str(KEEP_BYTES),
            "RMX_FREE_AFTER_S": str(FREE_AFTER_S), "RMX_KEEP_PAST_S": str(KEEP_PAST_S)}


def run_side(dep: Any, workdir: Path, standin: Path, after: str, out: SideRun, *, wait_s: float = 600.0) -> None:
    """Drive the side job beside the veRL job `after`: register it once `after` ran its first phase (so that
    their phases interleave), start its keeper on n1 and its victim on n2 (where it is placed), SIGKILL the
    victim inside Sync(0), wait for both ranks. Failures go to `out.error` (this runs in a thread)."""
    from rollmux.core.model import Deployment as Mode
    from rollmux.core.model import JobSpec
    from rollmux.wire.auth import operator_token
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(dep.coordinator.address, token=operator_token(dep.secret_file.read_text()))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    deadline = time.monotonic() + wait_s
    try:
        while not _granted(dep.node_events, after):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {after} was never granted a phase")
            time.sleep(0.2)
        spec = JobSpec(name=SIDE, **{**SIDE_SPEC, "deployment": Mode(SIDE_SPEC["deployment"])})  # type: ignore[arg-type]
        job = client.register_job(spec)
        out.token = str(job.token)
        marks = workdir / "marks"
        marks.mkdir(parents=True, exist_ok=True)
        for node, role in (("n1", "keeper"), ("n2", "victim")):
            e = side_rank_env(dep.sockets[node], SIDE, out.token, role, standin, marks, workdir / "side-phases.jsonl")
            with open(workdir / f"side-{role}.log", "wb") as log:  # the child keeps its own descriptor
                procs[node] = subprocess.Popen([sys.executable, "-c", SIDE_RANK], cwd=REPO, env=e, stdout=log,
                                               stderr=subprocess.STDOUT)
            out.pids[node] = procs[node].pid
        while not (marks / "victim.in-sync-0").exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise TimeoutError(f"the victim never entered Sync(0); see {workdir}/side-*.log")
            time.sleep(0.05)
        procs["n2"].send_signal(signal.SIGKILL)
        out.killed_at = time.time()
        for node, p in procs.items():
            out.rcs[node] = p.wait(max(1.0, deadline - time.monotonic()))
    except Exception as exc:  # noqa: BLE001 (a thread: the test asserts on it)
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        client.close()


def _granted(node_events: Path, job: str) -> bool:
    """A sidecar logged a grant of `job` to its ranks."""
    import json

    if not node_events.exists():
        return False
    rows = (json.loads(line) for line in node_events.read_text().splitlines() if line.strip())
    return any(r.get("event") == "granted" and r.get("job") == job for r in rows)
