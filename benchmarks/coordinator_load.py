"""Load benchmark of the coordinator: N jobs cycling run permits against the real server + real Redis.

    python benchmarks/coordinator_load.py [--jobs 2000] [--phase-ms 5000] [--seconds 10] [--check]
    python benchmarks/coordinator_load.py --jobs 500 --phase-ms 0      # saturation (closed loop), information

Design (printed with the figures):
- Starts its own redis-server (append-only file, fsync every second; or --redis URL) and a
  `rollmux coordinator` subprocess, registers one rollout and one training node per job and one job
  per node pair (SLO 1.0, so each job has its own group). A node is READY only while its sidecar's
  stream is open, so one more process holds every node's NodeStream (grpc.aio, a heartbeat every
  NODE_HEARTBEAT_S, the coordinator's --heartbeat-interval) for the whole run. Every phase a job asks for is therefore
  grantable the moment it asks (its nodes are free), and the grant latency measured is the
  service's own: RPC, validation, the transition, its durable commit to Redis, the answer.
- Each job is an asyncio coroutine in a separate client process (--clients processes, grpc.aio).
  Its first ask comes at a random moment within the first phase, as jobs start at different times:
  gRPC's server sheds part of a burst of over 1,000 simultaneous calls as CANCELLED (its pending-
  request limit, grpc.server.max_pending_requests), which is the transport's, not the load's.
  It holds every permit for --phase-ms (the phase "runs"; the paper prototype polls Redis every
  0.2 s, the default), then ends it and asks for the next phase, Rollout -> Train -> Sync ->
  Rollout, forever. Start times are spread over one phase so the load is steady, not in waves.
- The load generator's processes run on the coordinator's event loop (--event-loop, uvloop by
  default): one client process stands in for 2,000 jobs' shims on as many machines, so its own
  lateness is the benchmark's, not the service's, and is printed apart (client event loop late).
- --mode advance (default): one AdvancePermit call releases phase i and returns the grant of
  phase i+1 (one round trip, one commit). --mode acquire-release: ReleasePermit then
  AcquirePermit, two calls per phase (the API a shim without AdvancePermit uses).
- The window opens once every job has run the iterations after which the coordinator has learned
  its phase times (3 x learn_min_samples phases): those learning events come once per job, and as
  all jobs start together here they come in one burst that a running cluster spreads over job
  arrivals. --measure-learning opens the window right after the first phase to measure that burst.
- The service runs pinned to the first half of the CPUs and the load generator to the rest
  (--no-pin: anywhere), every process of the run at niceness --nice (-10 by default, where this
  user may raise priority; 0: as started), so that other work on a shared machine takes less of
  their CPUs: in a cluster the coordinator and its Redis have cores of their own, and the jobs'
  shims and sidecars are on other machines. The driver samples the VM's steal time and other
  processes' CPU on the service's CPUs beside the asks, and prints how many slow asks overlapped them.
- A permit cycle = one phase granted and released. Offered load = jobs / phase time; achieved =
  grants answered inside the measured window / window. Grant latency = client-observed time from
  asking for the (grantable) next phase to holding its durable grant: the AdvancePermit round trip,
  or the AcquirePermit round trip in acquire-release mode, for every ask made inside the window.
- The window closes honestly: no job asks after it has closed; an ask made inside the window and
  answered after it is awaited (drained), counts in the latency but not in the cycles, and is
  printed apart as "in flight at window close". Only an RPC that failed or a phase not granted is a
  client error; each is printed with its call, status code and time relative to the window.
- --phase-ms 0 turns it into a closed loop with zero think time: every job asks again at once, so
  the server is saturated and latency = jobs / throughput (Little's law); that mode measures peak
  throughput, and its latency is the queueing the clients create, not the service's.
- CPU seconds of the server, the client processes and redis-server over the window, and the load
  average, are printed beside the figures (the machine may be shared).

- --ceiling then drives a stateless no-op gRPC server (every call granted at once, no store) with
  the same clients: the most this machine's Python gRPC stack allows at that moment, so a shortfall
  can be told apart from the cost of the coordinator's own work.

- Server CPU per permit cycle (server CPU seconds over the window / cycles completed) is printed
  for the coordinator and the ceiling: it is the figure that tells the service's own cost apart
  from what a loaded machine leaves it. With the Redis it starts (or --redis), the number of
  commits Redis executed over the window (EVALSHA calls, from INFO commandstats) shows how many
  transitions shared each commit.

--check prints each target as MET, MISSED or N/A and exits 1 unless every applicable one is met.
The targets are what a cluster needs: a real RL phase lasts 30-600 s, so 2,000 jobs offer about
3-70 permit cycles/s; the default run (2,000 jobs, each holding a permit 5 s: 400 cycles/s, 10x the
fastest real phases) must achieve >= 0.95x the offered cycles/s with p99 grant latency <= 10 ms and
no client errors. A closed loop (--phase-ms 0) measures saturation: its cycles/s are information,
and the throughput and latency targets are N/A there (the latency is client-made queueing).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from rollmux.coordinator.service.event_loop import EventLoop, EventLoopUnavailable
from rollmux.coordinator.service.event_loop import resolve as resolve_event_loop
from rollmux.coordinator.service.event_loop import run as run_event_loop
from rollmux.core.ports import free_port
from rollmux.testing.chaos.procs import wait_port

MP = mp.get_context("spawn")  # never fork a process that has used gRPC (a forked child can hang in gRPC)
PAPER_POLL_S = 0.2
Job = tuple[str, str, int, int]  # name, token, first phase (protobuf enum), first iteration
TARGET_SHARE = 0.95  # achieved / offered permit cycles/s
TARGET_P99_S = 0.010


def cpu_ticks(pid: int) -> int:
    """User + system CPU time of a process, in clock ticks (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    return cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """What else ran on the CPUs over the window, in 10 ms samples (/proc): the hypervisor's steal
    time on this VM's CPUs, and other processes' CPU on the service's CPUs.

    On a shared VM the host may run other guests on our vCPUs, and other tenants' processes may run
    on the service's CPUs however it is pinned; the service stalls then, and no code in it can tell.
    Sampling both beside the asks tells such stalls apart from the service's own (``summary``).
    Figures are in the kernel's clock ticks (10 ms). A CPU's busy ticks and a process's ticks are
    counted by different clocks, so in one 10 ms sample the difference may read +1 and in the next -1
    for the same work: other processes' time is therefore summed unclamped, and judged per 100 ms bin
    (busy with others when they took 2 ticks or more of it, 20% of a CPU).
    """

    PERIOD_S = 0.01

    def __init__(self, t_start: float, t_end: float, service_pids: list[int], service_cpus: set[int] | None) -> None:
        import threading

        # (seconds since t_start at the sample's end, steal ticks, other processes' ticks on the service's CPUs)
        self.samples: list[tuple[float, int, int]] = []
        self._t_start, self._t_end = t_start, t_end
        self._pids, self._cpus = service_pids, service_cpus
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _ticks(self) -> tuple[int, int] | None:
        """(steal ticks of every CPU, busy ticks of the service's CPUs less the service's own), or None."""
        try:
            with open("/proc/stat") as f:
                lines = [ln.split() for ln in f if ln.startswith("cpu")]
            own = sum(cpu_ticks(pid) for pid in self._pids)
        except (OSError, ValueError):
            return None
        steal = int(lines[0][8]) if len(lines[0]) > 8 else 0
        # user, nice and system time of each service CPU: what processes ran there (irq and softirq time,
        # mostly the service's own loopback traffic, is charged to no process, so it is left out)
        busy = sum(int(f[1]) + int(f[2]) + int(f[3]) for f in lines[1:]
                   if self._cpus and int(f[0][3:]) in self._cpus)
        return steal, busy - own

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        time.sleep(max(0.0, self._t_start - time.monotonic()))
        prev = self._ticks()
        if prev is None:
            return
        due = time.monotonic()
        while (now := time.monotonic()) < self._t_end:
            due += self.PERIOD_S
            time.sleep(max(0.0, due - now))
            cur = self._ticks() or prev
            self.samples.append((time.monotonic() - self._t_start, cur[0] - prev[0], cur[1] - prev[1]))
            prev = cur

    def _overlap(self, what: str, column: int, asks: list[tuple[float, float]], slow_s: float, *,
                 bin_samples: int = 1, min_ticks: int = 1) -> str:
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        bins = [self.samples[i:i + bin_samples] for i in range(0, len(self.samples), bin_samples)]
        hot = [b[-1][0] for b in bins if sum(x[1 + column] for x in b) >= min_ticks]  # bin end times
        total_s = max(0, sum(x[1 + column] for x in self.samples)) * tick_s
        bin_s = self.PERIOD_S * bin_samples

        def hit(t0: float, lat: float) -> bool:  # a hot bin reaches [t0, t0 + lat]
            i = bisect.bisect_left(hot, t0)
            return i < len(hot) and hot[i] - bin_s <= t0 + lat

        slow = [(t, x) for t, x in asks if x > slow_s]
        slow_hit = sum(hit(t, x) for t, x in slow)
        all_hit = sum(hit(t, x) for t, x in asks)
        return (f"{what}: {total_s * 1e3:.0f} ms of CPU over the window, in {len(hot)} of {len(bins)} "
                f"{bin_s * 1e3:.0f} ms bins; asks over {slow_s * 1e3:.0f} ms overlapping such a bin: {slow_hit} of {len(slow)}"
                f" ({slow_hit / len(slow) * 100 if slow else 0:.0f}%; all asks: "
                f"{all_hit / len(asks) * 100 if asks else 0:.1f}%)")

    def summary(self, asks: list[tuple[float, float]], slow_s: float) -> str:
        """Steal, and other processes on the service's CPUs, over the window, and how many slow asks
        (over `slow_s`) overlapped a sample with either."""
        if not self.samples:
            return "VM steal and other processes: not measured (no /proc)"
        lines = [self._overlap("VM steal (the host ran others on our vCPUs)", 0, asks, slow_s)]
        if self._cpus:
            lines.append(self._overlap("other processes on the service's CPUs (this machine's other work)", 1,
                                       asks, slow_s, bin_samples=10, min_ticks=2))
        return "\n".join(lines)


def learning_s(phase_s: float, args: argparse.Namespace) -> float:
    """Seconds until every job has run the iterations after which the coordinator has learned its
    phase times (`PolicyConfig.learn_min_samples`, 3 phases each), or 0 with --measure-learning.

    The iteration that makes a job's times learned is a learning event (its profile changes, its
    group is queued for the paced planner): once per job. Here every job starts within one phase,
    so all 2,000 learn within one more: a burst no running cluster sees, measured with
    --measure-learning and left out of the default (steady-state) window.
    """
    from rollmux.coordinator.policy.api import PolicyConfig

    return 0.0 if args.measure_learning or not phase_s else 3 * PolicyConfig().learn_min_samples * phase_s


def cpu_split(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(CPUs of the service under test, CPUs of the load generator), or (None, None) when not pinned.

    In a cluster the coordinator and its Redis have their own cores, and the jobs' shims and the
    sidecars (the clients and the node streams here) run on other machines. Pinned, the service gets
    the first half of this machine's CPUs and the load generator the rest, so the two do not take
    each other's cores mid-call; other processes on the machine still run anywhere.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    half = (len(cpus) + 1) // 2
    return set(cpus[:half]), set(cpus[half:])


def _pinning(args: argparse.Namespace) -> str:
    if not args.sut_cpus:
        return "not pinned"
    return (f"service on CPU {','.join(map(str, sorted(args.sut_cpus)))}, load generator on CPU "
            f"{','.join(map(str, sorted(args.load_cpus)))}")


def set_niceness(nice: int) -> str:
    """Run this process, and every process it starts from now on, at niceness `nice`; says what was set."""
    if not nice:
        return "niceness as started"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as e:
        return f"niceness as started ({nice} refused: {e.strerror})"
    return f"niceness {nice}"


def pin_to(cpus: set[int] | None) -> None:
    """Run this process (and every thread it starts from now on) on `cpus` (None: anywhere)."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def _noop_server_proc(port: int, ready: mp.Event, cpus: set[int] | None = None,  # type: ignore[valid-type]
                      event_loop: str = "auto") -> None:
    """A stateless gRPC server answering every permit call with a grant at once (the --ceiling reference)."""
    pin_to(cpus)
    import grpc

    from rollmux.proto import rollmux_v1_pb2 as pb
    from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc

    class NoOp(pb_grpc.CoordinatorServicer):
        def __init__(self) -> None:
            self.epoch = 0

        def _grant(self, job: str) -> pb.AcquirePermitResponse:
            self.epoch += 1
            return pb.AcquirePermitResponse(outcome=pb.WAIT_OUTCOME_GRANTED,
                                            lease=pb.Lease(job=job, epoch=self.epoch, ttl_s=60.0))

        async def GetJob(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            return pb.JobStatus(job=request.job)

        async def AcquirePermit(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            return self._grant(request.job)

        async def ReleasePermit(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            return pb.ReleasePermitResponse()

        async def AdvancePermit(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            return pb.AdvancePermitResponse(released=pb.ReleasePermitResponse(), next=self._grant(request.job))

    async def serve() -> None:
        server = grpc.aio.server()
        pb_grpc.add_CoordinatorServicer_to_server(NoOp(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    run_event_loop(serve(), event_loop)


async def _client_main(address: str, jobs: list[Job], *, mode: str, phase_s: float, start_at: float,
                       t_measure: float, t_end: float, out: mp.Queue, keep_asks: bool = False) -> None:
    import grpc

    from rollmux.proto import rollmux_v1_pb2 as pb
    from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.CoordinatorStub(channel)
    lat: list[float] = []  # every ask made inside the window, also those answered after it closed
    asks: list[tuple[float, float]] = []  # (seconds into the window, latency) per ask, with --dump-asks
    cycles = 0  # grants answered inside the window
    in_flight_at_close = 0  # asks made inside the window, answered after it closed (drained)
    errors: list[dict[str, object]] = []
    rng = random.Random(os.getpid())

    async def next_grant(name: str, md: tuple[tuple[str, str], ...], epoch: int, held_s: float) -> object:
        if mode == "advance":
            adv = await stub.AdvancePermit(pb.AdvancePermitRequest(job=name, epoch=epoch, duration_s=held_s,
                                                                   timeout_s=5.0), metadata=md, timeout=10)
            return adv.next
        rel = await stub.ReleasePermit(pb.ReleasePermitRequest(job=name, epoch=epoch, duration_s=held_s),
                                       metadata=md, timeout=10)
        return await stub.AcquirePermit(pb.AcquirePermitRequest(job=name, phase=rel.next_phase,
                                                                iteration=rel.next_iteration, timeout_s=5.0),
                                        metadata=md, timeout=10)

    async def one(name: str, token: str, phase: int, iteration: int) -> None:
        nonlocal cycles, in_flight_at_close
        md = (("authorization", f"Bearer {token}"),)
        call = "AcquirePermit (first)"
        try:
            # first asks spread over one phase: jobs do not all start in the same millisecond (a burst of
            # over 1,000 calls at once is shed by gRPC's server, see --help)
            await asyncio.sleep(max(0.0, start_at - time.monotonic()) + rng.random() * phase_s)
            resp = await stub.AcquirePermit(pb.AcquirePermitRequest(job=name, phase=phase, iteration=iteration,
                                                                    timeout_s=5.0), metadata=md, timeout=10)
            while resp.outcome == pb.WAIT_OUTCOME_GRANTED:
                held = time.monotonic()
                if phase_s:
                    await asyncio.sleep(phase_s)
                t0 = time.monotonic()
                if t0 >= t_end:
                    return  # the window closed while the permit was held: no new ask
                call = mode
                resp = await next_grant(name, md, resp.lease.epoch, t0 - held)
                t1 = time.monotonic()
                if t0 >= t_measure:
                    lat.append(t1 - t0)
                    if keep_asks:
                        asks.append((t0 - t_measure, t1 - t0))
                    in_flight_at_close += t1 > t_end
                cycles += t_measure <= t1 <= t_end and resp.outcome == pb.WAIT_OUTCOME_GRANTED
            errors.append({"job": name, "call": call, "code": "NOT_GRANTED", "details": resp.reason,
                           "at_s": time.monotonic() - t_end})
        except grpc.aio.AioRpcError as exc:
            errors.append({"job": name, "call": call, "code": exc.code().name, "details": exc.details(),
                           "at_s": time.monotonic() - t_end})

    loop_lags: list[float] = []  # how late a 10 ms sleep in the window woke up, when over 2 ms

    async def sample_loop_lag() -> None:
        await asyncio.sleep(max(0.0, t_measure - time.monotonic()))
        while time.monotonic() < t_end:
            due = time.monotonic() + 0.01
            await asyncio.sleep(0.01)
            if (late := time.monotonic() - due) > 0.002:
                loop_lags.append(late)

    c0 = time.process_time()
    tasks = [asyncio.ensure_future(one(*j)) for j in jobs]
    lag_sampler = asyncio.ensure_future(sample_loop_lag())
    _quiet_heap()
    await asyncio.sleep(max(0.0, t_measure - time.monotonic()))
    c_measure = time.process_time()
    await asyncio.sleep(max(0.0, t_end - time.monotonic()))
    c_end = time.process_time()
    await lag_sampler
    for r in await asyncio.gather(*tasks, return_exceptions=True):  # drain: every ask gets its answer
        if isinstance(r, BaseException):
            errors.append({"job": "?", "call": "?", "code": type(r).__name__, "details": repr(r),
                           "at_s": time.monotonic() - t_end})
    await channel.close()
    out.put({"cycles": cycles, "lat": lat, "asks": asks, "cpu_s": c_end - c_measure, "setup_cpu_s": c_measure - c0,
             "in_flight_at_close": in_flight_at_close, "loop_lags": loop_lags, "errors": errors[:5], "n_errors": len(errors),
             "error_codes": _count(f"{e['call']}: {e['code']}" for e in errors)})


NODE_HEARTBEAT_S = 20.0


async def _node_streams_main(address: str, node_ids: list[str]) -> None:
    import grpc

    from rollmux.proto import rollmux_v1_pb2 as pb
    from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
    from rollmux.wire.client import NODE_METADATA_KEY

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.CoordinatorStub(channel)

    async def beats():  # type: ignore[no-untyped-def]
        gap = NODE_HEARTBEAT_S * random.uniform(0.5, 1.0)  # spread as a sidecar's (NodeSession) are
        while True:
            yield pb.NodeUp(heartbeat=pb.NodeHeartbeat())
            await asyncio.sleep(gap)
            gap = NODE_HEARTBEAT_S

    async def hold(node_id: str) -> None:
        delay = 0.05
        while True:  # as a sidecar does (NodeSession): reconnect with backoff whenever the stream ends
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for _ in stub.NodeStream(beats(), metadata=[(NODE_METADATA_KEY, node_id)]):
                    delay = 0.05
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    _quiet_heap()
    await asyncio.gather(*(hold(n) for n in node_ids))


def _quiet_heap() -> None:
    """Keep this load generator's own garbage collections out of the latency it measures.

    One client process holds a thousand jobs' coroutines and calls (a real job's shim holds one),
    so with CPython's defaults its full collections pause it for tens of ms while answers wait
    unread: that is the benchmark's cost, not the coordinator's. Its collections are paced the way
    the coordinator's are (`coordinator.service.gc_tuning.PacedCollector`, on the running loop).
    """
    from rollmux.coordinator.service import gc_tuning

    gc_tuning.PacedCollector().start()
    sys.setswitchinterval(gc_tuning.GIL_SWITCH_INTERVAL_S)


def _node_streams_proc(address: str, node_ids: list[str], cpus: set[int] | None = None,
                       event_loop: str = "auto") -> None:
    pin_to(cpus)
    run_event_loop(_node_streams_main(address, node_ids), event_loop)


def _count(keys: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return out


def _client_proc(address: str, jobs: list[Job], kw: dict, out: mp.Queue, cpus: set[int] | None = None,
                 event_loop: str = "auto") -> None:
    pin_to(cpus)
    run_event_loop(_client_main(address, jobs, out=out, **kw), event_loop)


def redis_commits(url: str | None) -> int | None:
    """EVALSHA calls Redis has executed so far (the coordinator's commits), or None without Redis."""
    if not url:
        return None
    import redis

    r = redis.Redis.from_url(url)
    try:
        stats = r.info("commandstats")
        return sum(int(stats.get(k, {}).get("calls", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))
    finally:
        r.close()


def _drive(address: str, jobs: list[Job], args: argparse.Namespace, pids: list[int],  # type: ignore[no-untyped-def]
           service_pids: list[int], redis_url: str | None = None):
    """Run the client processes against `address`; CPU seconds of `pids`, load average and Redis
    commits around the window, and what else ran on the CPUs (`service_pids`: the service under test)."""
    histograms(getattr(args, "metrics_url", None))  # imports and a first scrape now, not at the window's start
    redis_commits(redis_url)
    phase_s = args.phase_ms / 1000.0
    start_at = time.monotonic() + 2.0 + 0.002 * args.jobs  # client processes start, import and connect first
    t_measure = start_at + phase_s + learning_s(phase_s, args) + args.warmup
    t_end = t_measure + args.seconds
    kw = {"mode": args.mode, "phase_s": phase_s, "start_at": start_at, "t_measure": t_measure, "t_end": t_end,
          "keep_asks": True}
    out: mp.Queue = MP.Queue()
    shards = [jobs[k::args.clients] for k in range(args.clients)]
    workers = [MP.Process(target=_client_proc, args=(address, s, kw, out, args.load_cpus, args.event_loop),
                          daemon=True)
               for s in shards]
    for w in workers:
        w.start()
    sampler = CpuSampler(t_measure, t_end, service_pids, args.sut_cpus).start()
    time.sleep(max(0.0, t_measure - time.monotonic()))
    cpu0 = {pid: cpu_seconds(pid) for pid in pids}
    load0 = os.getloadavg()[0]
    commits0 = redis_commits(redis_url)
    hist0 = histograms(getattr(args, "metrics_url", None))
    time.sleep(max(0.0, t_end - time.monotonic()))
    cpu1 = {pid: cpu_seconds(pid) for pid in pids}
    load1 = os.getloadavg()[0]
    commits1 = redis_commits(redis_url)
    hist1 = histograms(getattr(args, "metrics_url", None))
    if commits0 is not None and commits1 is not None:
        args.redis_commits = commits1 - commits0
    if hist0 is not None and hist1 is not None:
        args.tails = {m: {k: n - hist0[m].get(k, 0.0) for k, n in hist1[m].items()} for m in hist1}
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join()
    sampler.join()
    return cpu0, cpu1, load0, load1, results, sampler


TAIL_METRICS = ("rollmux_gc_pause_seconds", "rollmux_event_loop_lag_seconds", "rollmux_grant_latency_seconds")
"""The coordinator histograms scraped around the window: where a slow grant spent its time."""


def histograms(url: str | None) -> dict[str, dict[tuple[str, str], float]] | None:
    """The TAIL_METRICS buckets so far, {metric: {(label value or "", le): count}}; None without
    /metrics. Differences over the window say how many samples fell over each bound."""
    if not url:
        return None
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, dict[tuple[str, str], float]] = {m: {} for m in TAIL_METRICS}
    for family in text_string_to_metric_families(text):
        if family.name in out:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    label = next((v for k, v in sample.labels.items() if k != "le"), "")
                    out[family.name][(label, sample.labels["le"])] = sample.value
    return out


def tail_summary(buckets: dict[tuple[str, str], float], labels: Iterable[str] = ("",)) -> str:
    """'612 (over 5 ms: 0, over 10 ms: 0)' per label value, from bucket-count differences."""
    parts = []
    for label in labels:
        total = buckets.get((label, "+Inf"), 0.0)
        over = {ms: total - buckets.get((label, f"{ms / 1e3}"), total) for ms in (5, 10)}
        parts.append(f"{label + ' ' if label else ''}{total:.0f} (over 5 ms: {over[5]:.0f}, over 10 ms: {over[10]:.0f})")
    return ", ".join(parts)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--phase-ms", type=float, default=5000.0,
                    help="how long each job holds each permit (0 = closed loop, zero think time: saturation)")
    ap.add_argument("--mode", choices=["advance", "acquire-release"], default="advance")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="seconds between the jobs' start (plus their learning iterations, see "
                         "--measure-learning) and the window")
    ap.add_argument("--measure-learning", action="store_true",
                    help="open the window right after the jobs' first phase, so that it holds their "
                         "learning events (all jobs start together here, so they learn together: a "
                         "burst a running cluster spreads over job arrivals); default: the window opens "
                         "once every job has run the iterations after which the coordinator has learned "
                         "its phase times (steady state)")
    ap.add_argument("--clients", type=int, default=1, help="client processes (jobs are split among them)")
    ap.add_argument("--redis", help="use this Redis instead of starting one")
    ap.add_argument("--embedded", action="store_true", help="embedded store instead of Redis (for comparison)")
    ap.add_argument("--check", action="store_true", help="exit 1 below the targets")
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    ap.add_argument("--dump-asks", metavar="FILE",
                    help="write every ask in the window as [seconds into the window, latency s] (JSON) to FILE: "
                         "a timeline that tells stall episodes from a spread tail")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin the service (coordinator, Redis) and the load generator (clients, node "
                         "streams, this driver) to separate CPUs (pinned by default where there are 2 or more)")
    ap.add_argument("--ceiling", action="store_true",
                    help="then drive a stateless no-op gRPC server the same way: what this machine's gRPC "
                         "stack allows right now, beside the coordinator's figures")
    ap.add_argument("--event-loop", choices=[e.value for e in EventLoop], default=EventLoop.AUTO.value,
                    help="the event loop of the coordinator (`rollmux coordinator --event-loop`) and of the "
                         "load generator's processes (clients, node streams, the --ceiling server): auto = "
                         "uvloop where installed, as the coordinator's own default [auto]")
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness of this run's processes, inherited by the service and the load generator "
                         "(default -10: other work on a shared machine yields to them; needs root or "
                         "CAP_SYS_NICE, else left as started; 0: as started)")
    args = ap.parse_args(argv)
    try:
        args.event_loop = resolve_event_loop(args.event_loop).value  # printed as the loop that ran
    except EventLoopUnavailable as exc:
        ap.error(f"--{exc}")
    args.sut_cpus, args.load_cpus = cpu_split(args.pin)
    args.niceness = set_niceness(args.nice)
    pin_to(args.load_cpus)  # this driver is part of the load generator

    from rollmux.core.model import JobSpec, Pool
    from rollmux.wire.client import CoordinatorClient
    from rollmux.wire.convert import PHASE_TO_PB

    tmp = Path(tempfile.mkdtemp(prefix="rollmux-load-"))
    procs: list[subprocess.Popen[bytes]] = []
    redis_proc: subprocess.Popen[bytes] | None = None
    streams: mp.Process | None = None  # type: ignore[name-defined]
    try:
        store_args: list[str]
        redis_url: str | None = None
        args.redis_commits = None
        if args.embedded:
            store_args = ["--embedded"]
        elif args.redis:
            store_args = ["--redis", args.redis]
            redis_url = args.redis
        else:
            redis_bin = shutil.which("redis-server")
            if not redis_bin:
                print("redis-server not found: install it, or pass --redis URL or --embedded", file=sys.stderr)
                return 2
            rport = free_port()
            redis_proc = subprocess.Popen([redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--dir",
                                           str(tmp), "--appendonly", "yes", "--appendfsync", "everysec",
                                           "--save", ""], stdout=subprocess.DEVNULL,
                                          preexec_fn=lambda: pin_to(args.sut_cpus))
            procs.append(redis_proc)
            wait_port(rport)
            redis_url = f"redis://127.0.0.1:{rport}/0"
            store_args = ["--redis", redis_url]
        port, http_port = free_port(), free_port()
        server = subprocess.Popen([sys.executable, "-m", "rollmux", "coordinator", *store_args, "--listen",
                                   f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http_port}", "--lease-ttl", "60",
                                   "--log-level", "warning", "--heartbeat-interval", str(NODE_HEARTBEAT_S),
                                   "--event-loop", args.event_loop],
                                  preexec_fn=lambda: pin_to(args.sut_cpus))
        args.metrics_url = f"http://127.0.0.1:{http_port}/metrics"
        procs.append(server)
        wait_port(port)
        address = f"127.0.0.1:{port}"
        client = CoordinatorClient(address, retry_s=30)
        t0 = time.monotonic()
        for i in range(args.jobs):
            client.register_node(f"r{i}", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12)
            client.register_node(f"t{i}", Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * 10**12)
        streams = MP.Process(target=_node_streams_proc, daemon=True,
                             args=(address, [f"{p}{i}" for i in range(args.jobs) for p in "rt"], args.load_cpus,
                                   args.event_loop))
        streams.start()
        while sum(n.state == "ready" for n in client.cluster_state().nodes) < 2 * args.jobs:
            if not streams.is_alive() or time.monotonic() - t0 > 120:
                print("the node streams did not connect", file=sys.stderr)
                return 1
            time.sleep(0.1)
        jobs = []
        for i in range(args.jobs):
            # training-bound with SLO 1.0: sharing a group would stretch any job's period, so none do
            spec = JobSpec(name=f"job{i}", n_rollout_gpus=8, n_train_gpus=8, t_roll_s=10.0, t_train_s=100.0,
                           slo=1.0, rollout_state_bytes=10**9, train_state_bytes=10**9)
            h = client.register_job(spec)
            if h.registration is None or h.registration.state != "admitted":
                print(f"job{i} not admitted: {h.registration}", file=sys.stderr)
                return 1
            jobs.append((h.name, h.token, PHASE_TO_PB[h.registration.next_phase], h.registration.next_iteration))
        groups = {client.job(n, t).status().group_id for n, t, _, _ in jobs}
        if len(groups) != args.jobs:
            print(f"{args.jobs} jobs share {len(groups)} groups: the benchmark needs one group per job", file=sys.stderr)
            return 1
        setup_s = time.monotonic() - t0
        client.close()

        phase_s = args.phase_ms / 1000.0
        cpu0, cpu1, load0, load1, results, sampler = _drive(address, jobs, args, [*(p.pid for p in procs), streams.pid],
                                                   [p.pid for p in procs], redis_url)
        streams_pid = streams.pid
        ceiling = None
        if args.ceiling:
            ready = MP.Event()
            noop_port = free_port()
            noop = MP.Process(target=_noop_server_proc, args=(noop_port, ready, args.sut_cpus, args.event_loop),
                              daemon=True)
            noop.start()
            ready.wait(30)
            n0, n1, _, _, nres, nsampler = _drive(f"127.0.0.1:{noop_port}", jobs, args, [noop.pid], [noop.pid])
            noop.terminate()
            noop.join(5)
            nlat = [x for r in nres for x in r["lat"]]
            ceiling = {"cycles_per_s": sum(r["cycles"] for r in nres) / args.seconds, "p50_s": pct(nlat, 0.5),
                       "p99_s": pct(nlat, 0.99), "server_cpu": (n1[noop.pid] - n0[noop.pid]) / args.seconds,
                       "client_cpu": sum(r["cpu_s"] for r in nres) / args.seconds,
                       "steal": nsampler.summary(sorted(a for r in nres for a in r["asks"]), TARGET_P99_S)}
    finally:
        if streams is not None:
            streams.terminate()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    n_errors = sum(r["n_errors"] for r in results)
    in_flight = sum(r["in_flight_at_close"] for r in results)
    for r in results:
        for e in r["errors"]:
            print(f"client error: {e['call']} of {e['job']}: {e['code']} {e['details']!r}, "
                  f"{e['at_s']:+.2f} s from the window's close", file=sys.stderr)
    codes: dict[str, int] = {}
    for r in results:
        for k, n in r["error_codes"].items():
            codes[k] = codes.get(k, 0) + n
    cycles = sum(r["cycles"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    if args.dump_asks:
        Path(args.dump_asks).write_text(json.dumps(sorted(a for r in results for a in r["asks"])))
    rate = cycles / args.seconds
    offered = args.jobs / phase_s if phase_s else float("inf")
    p50, p99 = pct(lat, 0.50), pct(lat, 0.99)
    mean = sum(lat) / len(lat) if lat else float("nan")
    store = "embedded" if args.embedded else ("redis (external)" if args.redis else "redis (aof everysec)")
    server_cpu = (cpu1[server.pid] - cpu0[server.pid]) / args.seconds
    redis_cpu = (cpu1[redis_proc.pid] - cpu0[redis_proc.pid]) / args.seconds if redis_proc else float("nan")
    client_cpu = sum(r["cpu_s"] for r in results) / args.seconds
    loop = "closed loop, zero think time" if not phase_s else f"each permit held {args.phase_ms:g} ms"
    print(f"coordinator load: {args.jobs} jobs ({loop}), mode={args.mode}, {args.clients} client process(es), "
          f"store={store}, event loop {args.event_loop}, {os.cpu_count()} CPUs ({_pinning(args)}, {args.niceness}), load average {load0:.2f} -> {load1:.2f}, "
          f"window {args.seconds:g} s after {learning_s(phase_s, args):g} s of learning iterations and "
          f"{args.warmup:g} s warm-up, setup {setup_s:.1f} s")
    streams_cpu = (cpu1[streams_pid] - cpu0[streams_pid]) / args.seconds
    print(f"CPU over the window (cores): server {server_cpu:.2f}, clients {client_cpu:.2f}, redis {redis_cpu:.2f}, "
          f"node streams {streams_cpu:.2f}")
    cpu_per_cycle = server_cpu * args.seconds / cycles if cycles else float("nan")
    commits = args.redis_commits
    per_commit = f", {cycles / commits:.2f} cycles per commit" if commits else ""
    print(f"server CPU per permit cycle: {cpu_per_cycle * 1e3:.3f} ms"
          + (f"; Redis commits over the window: {commits} ({commits / args.seconds:,.0f}/s{per_commit})"
             if commits is not None else ""))
    tails = getattr(args, "tails", None)
    if tails is not None:
        print("where the tail is, over the window (coordinator /metrics): garbage-collection passes "
              f"{tail_summary(tails['rollmux_gc_pause_seconds'], ('young', 'full'))}; event loop late "
              f"{tail_summary(tails['rollmux_event_loop_lag_seconds'])} of its 50 ms samples; grants "
              f"{tail_summary(tails['rollmux_grant_latency_seconds'])} from grantable to durable")
    lags = [x for r in results for x in r["loop_lags"]]
    print(f"client event loop late (10 ms samples) over 5 ms: {sum(x > 0.005 for x in lags)}, over 10 ms: "
          f"{sum(x > 0.010 for x in lags)}, worst {max(lags, default=0.0) * 1e3:.1f} ms")
    print(sampler.summary(sorted(a for r in results for a in r["asks"]), TARGET_P99_S))
    print(f"{'metric':<34}{'RollMux':>12}{'paper proto':>14}{'ratio':>10}{'target':>10}")
    print(f"{'permit cycles/s offered':<34}{offered:>12,.0f}")
    share = rate / offered if phase_s else float("nan")
    print(f"{'permit cycles/s achieved':<34}{rate:>12,.0f}{'-':>14}{share:>9.2f}x{f'{TARGET_SHARE:.2f}x':>10}"
          if phase_s else f"{'permit cycles/s achieved (saturation)':<34}{rate:>12,.0f}")
    print(f"{'grant latency p50 (ms)':<34}{p50 * 1e3:>12.2f}{PAPER_POLL_S / 2 * 1e3:>14.1f}"
          f"{PAPER_POLL_S / 2 / p50:>9.0f}x")
    print(f"{'grant latency p99 (ms)':<34}{p99 * 1e3:>12.2f}{PAPER_POLL_S * 0.99 * 1e3:>14.1f}"
          f"{PAPER_POLL_S * 0.99 / p99:>9.0f}x{TARGET_P99_S * 1e3:>10.1f}")
    print(f"{'grant latency mean (ms)':<34}{mean * 1e3:>12.2f}")
    print(f"{'asks in flight at window close':<34}{in_flight:>12}   (drained: in the latency, not in the cycles)")
    print(f"{'client errors':<34}{n_errors:>12}" + (f"   {codes}" if codes else ""))
    if ceiling is not None:
        print(f"ceiling (stateless no-op gRPC server, same clients, same machine, right after): "
              f"{ceiling['cycles_per_s']:,.0f} cycles/s, p50 {ceiling['p50_s'] * 1e3:.2f} ms, "
              f"p99 {ceiling['p99_s'] * 1e3:.2f} ms, server CPU {ceiling['server_cpu']:.2f}, "
              f"clients {ceiling['client_cpu']:.2f}; coordinator/ceiling = {rate / ceiling['cycles_per_s']:.2f}x")
        c_cycles = ceiling["cycles_per_s"]
        print(f"ceiling server CPU per permit cycle: {ceiling['server_cpu'] / c_cycles * 1e3 if c_cycles else float('nan'):.3f} ms "
              f"(coordinator: {cpu_per_cycle * 1e3:.3f} ms)")
        print(f"ceiling's {ceiling['steal']}")
    if not phase_s:
        print(f"note: closed loop, so latency ~ jobs / throughput = {args.jobs / max(rate, 1e-9) * 1e3:.0f} ms "
              "(Little's law): it measures client-made queueing, not the service")
    if args.json:
        print(json.dumps({"jobs": args.jobs, "phase_ms": args.phase_ms, "mode": args.mode, "clients": args.clients,
                          "store": store, "offered_cycles_per_s": offered, "cycles_per_s": rate, "p50_s": p50,
                          "p99_s": p99, "mean_s": mean, "server_cpu": server_cpu, "client_cpu": client_cpu,
                          "redis_cpu": redis_cpu, "server_cpu_per_cycle_s": cpu_per_cycle,
                          "redis_commits": commits, "loadavg": [load0, load1], "errors": n_errors,
                          "error_codes": codes, "in_flight_at_close": in_flight,
                          "coordinator_tails": {m: {f"{k}:{le}": n for (k, le), n in b.items()}
                                                for m, b in (tails or {}).items()},
                          "client_loop_lags_over_2ms_s": lags,
                          "ceiling": ceiling}))
    results_ok = _report_checks(args, offered=offered, rate=rate, p99=p99, n_errors=n_errors)
    return 0 if results_ok or not args.check else 1


def _report_checks(args: argparse.Namespace, *, offered: float, rate: float, p99: float, n_errors: int) -> bool:
    """Each target MET / MISSED / N/A (printed with --check); True when every applicable one is met."""
    closed = args.phase_ms == 0  # saturation run: its throughput and latency are information
    checks = [(f"achieved >= {TARGET_SHARE:.2f}x offered", f"{rate:,.0f} of {offered:,.0f} cycles/s",
               None if closed else rate >= TARGET_SHARE * offered),
              (f"p99 grant latency <= {TARGET_P99_S * 1e3:.0f} ms", f"{p99 * 1e3:.2f} ms",
               None if closed else p99 <= TARGET_P99_S),
              ("no client errors", f"{n_errors} errors", n_errors == 0)]
    ok = all(met is not False for _, _, met in checks)
    if args.check:
        for target, got, met in checks:
            verdict = {True: "MET", False: "MISSED", None: "N/A"}[met]
            note = ": closed loop, the saturation figures are information" if met is None else ""
            print(f"check: {target:<34} {verdict:<7} ({got}, {args.jobs} jobs{note})")
        print(f"check: {'every applicable target met' if ok else 'FAILED: not every target is met'} "
              f"(the targets are set at --jobs 2000 --phase-ms 5000)")
    return ok


if __name__ == "__main__":
    sys.exit(main())
