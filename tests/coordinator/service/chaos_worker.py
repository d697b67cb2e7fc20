"""A tiny job (or sidecar) process for the chaos test; its phases sleep. Not a test module.

    python chaos_worker.py job --coordinator ADDR --job NAME --token T --iterations N --log PATH
    python chaos_worker.py sidecar --coordinator ADDR --node r0 [--node r1 ...] --pool rollout

The job appends one line per event to the shared log (O_APPEND, one write per line):
``<t> start <job> <phase> <iter> <epoch> <nodes,>`` after a grant, ``<t> end ...`` before releasing,
``<t> released ...`` after the release is acknowledged, ``<t> done <job>`` at the end. A restarted job
resumes from the coordinator's cursor (GetJob).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from rollmux.coordinator.service.client import CoordinatorClient, NodeSession
from rollmux.model import Pool


def log_line(fd: int, *parts: object) -> None:
    os.write(fd, (" ".join(str(p) for p in (f"{time.time():.6f}", *parts)) + "\n").encode())


def run_job(args: argparse.Namespace) -> int:
    client = CoordinatorClient(args.coordinator, retry_s=60.0)
    job = client.job(args.job, args.token)
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    info = job.status()
    phase, it = info.next_phase, info.next_iteration
    while it < args.iterations:
        with job.hold(phase, it, timeout_s=120) as held:
            p = held.permit
            nodes = ",".join(p.nodes)
            log_line(fd, "start", args.job, phase.value, it, p.epoch, nodes)
            time.sleep(args.phase_s)
            if held.lost.is_set():
                log_line(fd, "lost", args.job, phase.value, it, p.epoch, nodes)
                return 3
            log_line(fd, "end", args.job, phase.value, it, p.epoch, nodes)
        log_line(fd, "released", args.job, phase.value, it, p.epoch, nodes)
        info = job.status()
        phase, it = info.next_phase, info.next_iteration
    log_line(fd, "done", args.job)
    return 0


def run_sidecar(args: argparse.Namespace) -> int:
    client = CoordinatorClient(args.coordinator, retry_s=60.0)
    sessions = [NodeSession(client, node, Pool(args.pool), gpu_type="H20" if args.pool == "rollout" else "H800",
                            gpu_count=8, host_dram_bytes=2 * 10**12, heartbeat_s=0.2).start() for node in args.node]
    signal.signal(signal.SIGTERM, lambda *_: [s.stop() for s in sessions])
    while any(s._thread.is_alive() for s in sessions):  # noqa: SLF001
        time.sleep(0.2)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    j = sub.add_parser("job")
    j.add_argument("--coordinator", required=True)
    j.add_argument("--job", required=True)
    j.add_argument("--token", required=True)
    j.add_argument("--iterations", type=int, required=True)
    j.add_argument("--log", required=True)
    j.add_argument("--phase-s", type=float, default=0.05)
    s = sub.add_parser("sidecar")
    s.add_argument("--coordinator", required=True)
    s.add_argument("--node", action="append", required=True)
    s.add_argument("--pool", choices=["rollout", "train"], required=True)
    args = ap.parse_args()
    return run_job(args) if args.what == "job" else run_sidecar(args)


if __name__ == "__main__":
    sys.exit(main())
