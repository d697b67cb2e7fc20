"""Load benchmark of the coordinator: concurrent jobs cycling acquire/release against the real server + Redis.

    python benchmarks/coordinator_load.py --jobs 500 --seconds 10 [--check]

Starts its own redis-server (or uses --redis URL) and a `rollmux coordinator` subprocess, registers
one rollout and one training node per job (SLO 1.0, so every job gets its own group and permits
never queue behind another job: what is measured is the service path, grant and release each made
durable in Redis), then runs --jobs concurrent async clients in --clients processes, each looping
AcquirePermit -> ReleasePermit through Rollout -> Train -> Sync. Prints permit cycles/s and the
client-observed grant latency (AcquirePermit round trip) beside the paper prototype, which polls a
Redis key every 0.2 s (a grant is seen 0.1 s late on average, up to 0.2 s). --check exits non-zero
below the targets (>= 2,000 cycles/s, p99 grant latency <= 10 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAPER_POLL_S = 0.2
TARGET_CYCLES_S = 2000.0
TARGET_P99_S = 0.010


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port}")


async def _client_main(address: str, jobs: list[tuple[str, str]], seconds: float, warmup: float,
                       out: mp.Queue) -> None:
    import grpc

    from rollmux.proto import rollmux_v1_pb2 as pb
    from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.CoordinatorStub(channel)
    start = time.monotonic()
    t_measure, t_end = start + warmup, start + warmup + seconds
    lat: list[float] = []
    cycles = 0
    order = (pb.PHASE_ROLLOUT, pb.PHASE_TRAIN, pb.PHASE_SYNC)

    async def one(name: str, token: str) -> None:
        nonlocal cycles
        md = (("authorization", f"Bearer {token}"),)
        st = await stub.GetJob(pb.GetJobRequest(job=name), metadata=md)
        phase, it = st.next_phase, st.next_iteration
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            resp = await stub.AcquirePermit(pb.AcquirePermitRequest(job=name, phase=phase, iteration=it,
                                                                    timeout_s=5.0), metadata=md, timeout=10)
            t1 = time.monotonic()
            if resp.outcome != pb.WAIT_OUTCOME_GRANTED:
                raise RuntimeError(f"{name}: {resp.reason}")
            rel = await stub.ReleasePermit(pb.ReleasePermitRequest(job=name, epoch=resp.lease.epoch,
                                                                   duration_s=0.0), metadata=md, timeout=10)
            if t0 >= t_measure and t1 <= t_end:
                lat.append(t1 - t0)
                cycles += 1
            phase, it = rel.next_phase, rel.next_iteration
            assert order.index(phase) >= 0

    await asyncio.gather(*(one(n, t) for n, t in jobs))
    await channel.close()
    out.put({"cycles": cycles, "lat": lat})


def _client_proc(address: str, jobs: list[tuple[str, str]], seconds: float, warmup: float, out: mp.Queue) -> None:
    asyncio.run(_client_main(address, jobs, seconds, warmup, out))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=1, help="client processes")
    ap.add_argument("--redis", help="use this Redis instead of starting one")
    ap.add_argument("--embedded", action="store_true", help="embedded store instead of Redis (for comparison)")
    ap.add_argument("--check", action="store_true", help="exit 1 below the targets")
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = ap.parse_args(argv)

    from rollmux.coordinator.service.client import CoordinatorClient
    from rollmux.model import JobSpec, Pool

    tmp = Path(tempfile.mkdtemp(prefix="rollmux-load-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        store_args: list[str]
        if args.embedded:
            store_args = ["--embedded"]
        elif args.redis:
            store_args = ["--redis", args.redis]
        else:
            redis_bin = shutil.which("redis-server")
            if not redis_bin:
                print("redis-server not found: install it, or pass --redis URL or --embedded", file=sys.stderr)
                return 2
            rport = free_port()
            procs.append(subprocess.Popen([redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--dir",
                                           str(tmp), "--appendonly", "yes", "--appendfsync", "everysec",
                                           "--save", ""], stdout=subprocess.DEVNULL))
            wait_port(rport)
            store_args = ["--redis", f"redis://127.0.0.1:{rport}/0"]
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "rollmux", "coordinator", *store_args, "--listen",
                                       f"127.0.0.1:{port}", "--http", "", "--lease-ttl", "60",
                                       "--log-level", "warning"]))
        wait_port(port)
        address = f"127.0.0.1:{port}"
        client = CoordinatorClient(address, retry_s=30)
        t0 = time.monotonic()
        for i in range(args.jobs):
            client.register_node(f"r{i}", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12)
            client.register_node(f"t{i}", Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * 10**12)
        jobs = []
        for i in range(args.jobs):
            spec = JobSpec(name=f"job{i}", n_rollout_gpus=8, n_train_gpus=8, t_roll_s=100.0, t_train_s=100.0,
                           slo=1.0, rollout_state_bytes=10**9, train_state_bytes=10**9)
            h = client.register_job(spec)
            if h.registration.state != "admitted":
                print(f"job{i} not admitted: {h.registration}", file=sys.stderr)
                return 1
            jobs.append((h.name, h.token))
        setup_s = time.monotonic() - t0
        client.close()

        out: mp.Queue = mp.Queue()
        shards = [jobs[k::args.clients] for k in range(args.clients)]
        workers = [mp.Process(target=_client_proc, args=(address, s, args.seconds, args.warmup, out))
                   for s in shards]
        for w in workers:
            w.start()
        results = [out.get(timeout=args.warmup + args.seconds + 120) for _ in workers]
        for w in workers:
            w.join()
        cycles = sum(r["cycles"] for r in results)
        lat = [x for r in results for x in r["lat"]]
        rate = cycles / args.seconds
        p50, p99 = pct(lat, 0.50), pct(lat, 0.99)
        store = "embedded" if args.embedded else "redis"
        print(f"coordinator load: {args.jobs} jobs, {args.clients} client process(es), store={store}, "
              f"{os.cpu_count()} CPUs, setup {setup_s:.1f}s")
        print(f"{'metric':<34}{'RollMux':>12}{'paper proto':>14}{'ratio':>10}{'target':>10}")
        print(f"{'permit cycles/s (acq+rel)':<34}{rate:>12,.0f}{'-':>14}{'':>10}{TARGET_CYCLES_S:>10,.0f}")
        print(f"{'grant latency p50 (ms)':<34}{p50 * 1e3:>12.2f}{PAPER_POLL_S / 2 * 1e3:>14.1f}"
              f"{PAPER_POLL_S / 2 / p50:>9.0f}x{'':>10}")
        print(f"{'grant latency p99 (ms)':<34}{p99 * 1e3:>12.2f}{PAPER_POLL_S * 0.99 * 1e3:>14.1f}"
              f"{PAPER_POLL_S * 0.99 / p99:>9.0f}x{TARGET_P99_S * 1e3:>10.1f}")
        print(f"{'grant latency mean (ms)':<34}{statistics.fmean(lat) * 1e3:>12.2f}")
        if args.json:
            print(json.dumps({"jobs": args.jobs, "cycles_per_s": rate, "p50_s": p50, "p99_s": p99, "store": store}))
        ok = rate >= TARGET_CYCLES_S and p99 <= TARGET_P99_S
        if args.check and not ok:
            print(f"CHECK FAILED: want >= {TARGET_CYCLES_S:.0f} cycles/s and p99 <= {TARGET_P99_S * 1e3:.0f} ms",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
