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

    times: dict[str, list[float]] = defaultdict(list)

    class Own:
        def enter(self, phase: str, iteration: int):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            ctx = shim.phase(phase, iteration=iteration)
            ctx.__enter__()
            times[f"shim acquire {phase}"].append(time.perf_counter() - t0)
            return phase, ctx

        def exit(self, handle) -> None:  # type: ignore[no-untyped-def]
            phase, ctx = handle
            t0 = time.perf_counter()
            ctx.__exit__(None, None, None)
            times[f"shim release {phase}"].append(time.perf_counter() - t0)

    class Roll:
        def enter(self, phase: str, iteration: int):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            ctx = rank.enter(phase, iteration)
            times[f"shim acquire {phase}"].append(time.perf_counter() - t0)
            return ctx

        def exit(self, handle) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            rank.exit(handle)
            times["shim release rollout"].append(time.perf_counter() - t0)

    own, roll = Own(), Roll()
    tracker = PhaseTracker(gate_for=lambda p: roll if p == "rollout" else own)
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


def direct(cluster, iterations: int) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """The coordinator hop alone: a second job's permits asked and released by a JobClient over gRPC
    (no sidecar, no shim), each call one round trip plus the store commit behind it."""
    from rollmux.core.model import Phase

    job = cluster.client.register_job(_spec("permit-path-direct"))
    times: dict[str, list[float]] = defaultdict(list)
    try:
        for it in range(iterations):
            for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):
                t0 = time.perf_counter()
                lease = job.acquire(phase, it, timeout_s=30.0)
                t1 = time.perf_counter()
                job.release(lease, 0.0)
                times[f"coordinator acquire {phase.value}"].append(t1 - t0)
                times[f"coordinator release {phase.value}"].append(time.perf_counter() - t1)
    finally:
        job.deregister()
    return times


def store_commit(url: str, n: int) -> list[float]:
    """The Redis hop alone: one transactional write of a permit-sized record, as a commit sends it."""
    import redis

    client = redis.Redis.from_url(url)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=True)
        pipe.set("rollmux-bench/permit", "x" * 400)
        pipe.set("rollmux-bench/seq", i)
        pipe.execute()
        out.append(time.perf_counter() - t0)
    client.close()
    return out


def process_walk(n: int) -> list[float]:
    """What the sidecar's memory check adds per release where NVML (or its stand-in) reports per-process
    memory: the walk of /proc for the processes below the job's ranks."""
    import os

    from rollmux.sidecar.proctree import with_descendants

    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with_descendants([os.getpid()])
        out.append(time.perf_counter() - t0)
    return out


def ray_call(n: int) -> list[float]:
    """One Ray actor method round trip: what each controller -> gate or board step of the veRL and ROLL
    adapters costs (their phase boundary makes several, see the results page)."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Gate:
            def step(self, x: int) -> int:
                return x

        gate = Gate.remote()  # type: ignore[attr-defined]
        ray.get(gate.step.remote(0))
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            ray.get(gate.step.remote(i))
            out.append(time.perf_counter() - t0)
        return out
    finally:
        ray.shutdown()


def _ms(vals: list[float], q: float = 0.5) -> float:
    vals = sorted(vals)
    if q == 0.5:
        return statistics.median(vals) * 1e3
    return vals[max(0, int(len(vals) * q) - 1)] * 1e3


def print_hops(times: dict[str, list[float]]) -> None:
    """Per hop, the median cost of one phase boundary's acquire and release, and what each hop adds."""
    print(f"\n{'hop (median ms)':<44}{'acquire':>9}{'release':>9}")
    for phase in ("rollout", "train", "sync"):
        co_a, co_r = _ms(times[f"coordinator acquire {phase}"]), _ms(times[f"coordinator release {phase}"])
        sh_a, sh_r = _ms(times[f"shim acquire {phase}"]), _ms(times[f"shim release {phase}"])
        print(f"{phase + ': coordinator + store (JobClient, gRPC)':<44}{co_a:>9.2f}{co_r:>9.2f}")
        print(f"{phase + ': shim -> sidecar -> coordinator':<44}{sh_a:>9.2f}{sh_r:>9.2f}")
        print(f"{'   of which shim + sidecar (UDS gRPC, fan-out)':<44}{sh_a - co_a:>9.2f}{sh_r - co_r:>9.2f}")
    print(f"{'store commit (Redis MULTI/EXEC round trip)':<44}{_ms(times['redis commit']):>9.2f}")
    print(f"{'memory check /proc walk (with per-PID memory)':<44}{'':>9}{_ms(times['process walk']):>9.2f}")
    if times.get("ray call"):
        print(f"{'one Ray actor call (controller -> gate/board)':<44}{_ms(times['ray call']):>9.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20, help="job iterations to time (default 20; +1 warm-up)")
    ap.add_argument("--backend", choices=("redis", "memory"), default="redis",
                    help="coordinator store (default redis, as the veRL harness runs it)")
    ap.add_argument("--ray", action="store_true", help="also time one Ray actor call (the adapters' gate hop)")
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
            times.update(direct(cluster, args.iterations + 1))
        if redis is not None:
            times["redis commit"] = store_commit(redis.url, 10 * args.iterations + 1)
        times["process walk"] = process_walk(args.iterations + 1)
        if args.ray:
            times["ray call"] = ray_call(10 * args.iterations + 1)
    finally:
        if redis is not None:
            redis.stop()
    print(f"permit path, one job alone, {args.iterations} iterations (first one dropped), {args.backend} store")
    print(f"{'boundary (adapter tracker)':<28}{'median ms':>10}{'p90 ms':>10}")
    for key in ("to rollout", "to train", "to sync", "close sync", "iteration"):
        vals = times[key][1:]
        print(f"{key:<28}{_ms(vals):>10.1f}{_ms(vals, 0.9):>10.1f}")
    times = {k: v[1:] for k, v in times.items()}
    if "redis commit" not in times:
        times["redis commit"] = [0.0]
    print_hops(times)
    print("\nWhat can go: the release's /proc walk where the GPU provider cannot tell per-process memory "
          "(skipped now), and its fixed 50 ms re-poll (now 2 ms, backing off); the sidecar's sleep-and-retry "
          "while the job's other rank still holds the previous phase (the coordinator now waits for that "
          "release and answers at once). A boundary's release and next acquire are two round trips where "
          "one AdvancePermit would do when both phases are on the same node (train -> sync).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
