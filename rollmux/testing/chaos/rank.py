"""A chaos job process; its phases sleep. Two kinds:

    python -m rollmux.testing.chaos.rank shim --role rollout|train --iterations N --log PATH [--phase-s S]
    python -m rollmux.testing.chaos.rank direct --coordinator ADDRS --job NAME --iterations N --log PATH [--phase-s S]

``shim`` is one rank of a job gated through its node's sidecar with ``rollmux.phase`` (socket, job
and token come from the ``ROLLMUX_*`` variables, as in a real trainer): the rollout rank runs
Rollout(i), the training rank Train(i) and Sync(i). A dead rank aborts its job at the sidecar, so
the harness starts the job again as a new run. ``direct`` is a whole job talking to the
coordinator itself (``JobClient.hold``, token in ``ROLLMUX_JOB_TOKEN``); restarted after a crash it
resumes from the coordinator's cursor.

Each process appends one JSON line per event to the shared log (O_APPEND, one write per line):
``start`` once the permit is held, ``end`` when the phase body is over (before the release),
``lost`` when the permit was revoked mid-phase, ``released`` once the release is acknowledged,
``done`` at the end; fields ``t, ev, run, role, pid, phase, it, epoch, nodes``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

LOST_EXIT = 3  # the permit was revoked mid-phase (fenced)


class EventLog:
    """Appends this process's events to the shared log, one write per line."""

    def __init__(self, path: str, run: str, role: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.base = {"run": run, "role": role, "pid": os.getpid()}

    def write(self, ev: str, **fields: Any) -> None:
        rec = {"t": round(time.time(), 6), "ev": ev, **self.base, **fields}
        os.write(self.fd, (json.dumps(rec) + "\n").encode())


def run_shim(args: argparse.Namespace) -> int:
    import rollmux
    from rollmux.shim import env
    from rollmux.wire.errors import LeaseLostError

    rollmux.init(rank=0 if args.role == "train" else 1)
    log = EventLog(args.log, os.environ[env.JOB], args.role)
    phases = ("rollout",) if args.role == "rollout" else ("train", "sync")
    for it in range(args.iterations):
        for name in phases:
            where: dict[str, Any] = {}
            try:
                with rollmux.phase(name, iteration=it) as ctx:
                    assert ctx is not None and ctx.lease is not None, "opted in: a phase holds its permit"
                    where = {"phase": name, "it": it, "epoch": ctx.lease.epoch, "nodes": list(ctx.lease.nodes)}
                    log.write("start", **where)
                    try:
                        time.sleep(args.phase_s)
                    finally:
                        log.write("end", **where)
            except LeaseLostError:
                log.write("lost", **where)
                return LOST_EXIT
            log.write("released", **where)
    log.write("done")
    rollmux.shutdown(job_done=args.role == "train")
    return 0


def run_direct(args: argparse.Namespace) -> int:
    from rollmux.shim import env
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(args.coordinator.split(","), retry_s=60.0)
    job = client.job(args.job, os.environ[env.JOB_TOKEN])
    log = EventLog(args.log, args.job, "direct")
    info = job.status()
    phase, it = info.next_phase, info.next_iteration
    while it < args.iterations:
        with job.hold(phase, it, timeout_s=120) as held:
            p = held.permit
            where = {"phase": phase.value, "it": it, "epoch": p.epoch, "nodes": list(p.nodes)}
            log.write("start", **where)
            time.sleep(args.phase_s)
            if held.lost.is_set():
                log.write("lost", **where)
                return LOST_EXIT
            log.write("end", **where)
        log.write("released", **where)
        info = job.status()
        phase, it = info.next_phase, info.next_iteration
    log.write("done")
    job.deregister()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollmux.testing.chaos.rank", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    shim = sub.add_parser("shim", help="one rank gated through its node's sidecar")
    shim.add_argument("--role", choices=["rollout", "train"], required=True)
    direct = sub.add_parser("direct", help="a whole job talking to the coordinator")
    direct.add_argument("--coordinator", required=True, help="host:port[,host:port]")
    direct.add_argument("--job", required=True)
    for p in (shim, direct):
        p.add_argument("--iterations", type=int, required=True)
        p.add_argument("--log", required=True, help="shared JSON-lines event log")
        p.add_argument("--phase-s", type=float, default=0.1, help="how long each phase body sleeps")
    args = ap.parse_args(argv)
    return run_shim(args) if args.kind == "shim" else run_direct(args)


if __name__ == "__main__":
    sys.exit(main())
