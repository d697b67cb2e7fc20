"""Cost of one job's phase boundaries through the real permit path, with the nodes free.

    .venv/bin/python benchmarks/permit_path.py [--iterations 20] [--backend redis|memory]

Starts what an opted-in job talks to on one machine: redis-server, the Redis-backed coordinator
with a bootstrap secret, a rollout-pool and a train-pool sidecar (``rollmux.demo.launch.LocalCluster``).
One job registers through the train sidecar and runs the adapter's phase tracker
(``rollmux.adapters.common.PhaseTracker``) over two ranks, as the veRL adapter does in its
TaskRunner: rollout on the rollout sidecar, train and sync on the train sidecar. Phase bodies are
empty, so every millisecond printed is permit-path cost: per boundary (rollout/train/sync opened,
closed) the median and p90 wall time of the tracker call, and the per-iteration total, which is
what the permit path adds to one training step of a job running alone. Nothing else runs on the
nodes, so no wait is for another job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spec(name: str):  # type: ignore[no-untyped-def]
    from rollmux.core.model import JobSpec

    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)


def measure(cluster, iterations: int) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """Seconds per tracker call, keyed ``<action> <phase>``, plus ``iteration`` totals."""
    from rollmux.adapters.common import PhaseTracker
    from rollmux.shim import api as shim
    from rollmux.shim import registration

    reg = registration.register(_spec("permit-path"), socket=cluster.sockets["train"])
    shim.init(socket=cluster.sockets["train"], job=reg.job, job_token=reg.token)
    rank = shim.attach_rank(socket=cluster.sockets["rollout"], job=reg.job, job_token=reg.token, rank=1)

    class Own:
        def enter(self, phase: str, iteration: int):  # type: ignore[no-untyped-def]
            ctx = shim.phase(phase, iteration=iteration)
            ctx.__enter__()
            return ctx

        def exit(self, handle) -> None:  # type: ignore[no-untyped-def]
            handle.__exit__(None, None, None)

    class Roll:
        def enter(self, phase: str, iteration: int):  # type: ignore[no-untyped-def]
            return rank.enter(phase, iteration)

        def exit(self, handle) -> None:  # type: ignore[no-untyped-def]
            rank.exit(handle)

    own, roll = Own(), Roll()
    tracker = PhaseTracker(gate_for=lambda p: roll if p == "rollout" else own)
    times: dict[str, list[float]] = defaultdict(list)
    try:
        for _ in range(iterations):
            t_it = time.perf_counter()
            for phase in ("rollout", "train", "sync"):
                t0 = time.perf_counter()
                tracker.begin(phase)  # closes the open phase first: the two halves are timed together
                times[f"to {phase}"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tracker.end("sync")
            times["close sync"].append(time.perf_counter() - t0)
            times["iteration"].append(time.perf_counter() - t_it)
    finally:
        tracker.end()
        rank.close()
        shim.shutdown(job_done=True)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20, help="job iterations to time (default 20; +1 warm-up)")
    ap.add_argument("--backend", choices=("redis", "memory"), default="redis",
                    help="coordinator store (default redis, as the veRL harness runs it)")
    args = ap.parse_args(argv)
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")
    sys.path.insert(0, str(ROOT))
    from rollmux.demo.launch import LocalCluster
    from rollmux.testing.chaos.procs import RedisProcess

    work = Path(tempfile.mkdtemp(prefix="rollmux-permit-path-"))
    redis = RedisProcess(work) if args.backend == "redis" else None
    if redis is not None:
        redis.start()
    try:
        with LocalCluster(work, redis_url=redis.url if redis else None, secret="permit-path-secret") as cluster:
            times = measure(cluster, args.iterations + 1)
    finally:
        if redis is not None:
            redis.stop()
    print(f"permit path, one job alone, {args.iterations} iterations (first one dropped), {args.backend} store")
    print(f"{'boundary':<16}{'median ms':>10}{'p90 ms':>10}")
    for key, vals in times.items():
        vals = vals[1:]
        p90 = sorted(vals)[max(0, int(len(vals) * 0.9) - 1)]
        print(f"{key:<16}{statistics.median(vals) * 1e3:>10.1f}{p90 * 1e3:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
