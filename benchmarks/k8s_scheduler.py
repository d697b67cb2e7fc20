"""The RollMux scheduler against a real kube-apiserver: gang latency and placements per second with
100 and 1,000 jobs pending, among `--nodes` more Node objects that default-scheduler pods run on.

For each N: a real kube-apiserver 1.20.2 + etcd (scripts/build_kube.sh), a real gRPC coordinator and
the scheduler. N *pending* jobs are created first: `--queued` of them (all N by default) ask for more
training nodes than the fleet has, so the coordinator keeps them in its admission queue; the others (with
`--queued` below N) are gangs with a pod still to come. The scheduler watches all of their pods and
explains itself to each (a waiting gang is looked at again every resync, 1 s). The coordinator decides a
queued job again only when what it did not fit with changed (`runtime.admission`; its cost alone:
admission_queue.py), so a probe's registration with 1,000 jobs queued decides the probe, and a probe's
departure a few of the queued jobs. Then rounds of probe jobs, each
a rollout and a training pod that fit, are created at once (one gang per node pair of the fleet); a
probe's latency is from its last pod created to both pods bound (read through a watch, as a
controller would see it), and a round's placements per second is its gangs over the time from its
first pod created to its last gang bound. Between rounds the probes leave (removed at the coordinator,
pods deleted). Printed beside: the coordinator's admission call for a probe (RegisterJob with N jobs
queued), as the scheduler timed it.

Every Node object counts: the scheduler's informer lists and watches all of them (paged), and fits
each gang against allocatable minus every bound pod of any scheduler, so the `--nodes` Node objects
(each with a default-scheduler pod bound on it, as kube-scheduler would bind it) are what a real cluster
shared with other workloads costs it.

    python benchmarks/k8s_scheduler.py [--jobs 100,1000] [--queued N] [--nodes 2000] [--pairs 5]
                                       [--rounds 5] [--check]

--check exits non-zero unless, at the largest N, the p99 gang latency is <= 1 s and the median round
places >= TARGET_GANGS_PER_S gangs per second.

Beside the result: kube-scheduler's own density benchmark schedules about 1,000 pods/s (single pods,
no gang, no admission call), and Volcano is documented at "up to 1000 pods per second" (Huawei Cloud
CCE's Volcano scheduler page). A RollMux gang is one job of a few pods that runs for hours, admitted by
the coordinator's policy (one RegisterJob round trip, tens of ms at 1,000 queued jobs): the target is
TARGET_GANGS_PER_S gangs/s, which places a burst of 1,000 arriving jobs in under two minutes, far
below the minutes such jobs take to start (image pull, model load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollmux.coordinator.service.runtime.api import ServiceConfig  # noqa: E402
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer  # noqa: E402
from rollmux.core.model import Pool  # noqa: E402
from rollmux.k8s.kube import KubeClient  # noqa: E402
from rollmux.k8s.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from rollmux.testing import kube as control_plane  # noqa: E402
from rollmux.wire.client import CoordinatorClient, NodeSession  # noqa: E402
from tests.k8s.builders import node_obj, pod_obj  # noqa: E402

TARGET_P99_S = 1.0
TARGET_GANGS_PER_S = 10.0
KUBE_SCHEDULER_PODS_PER_S = 1000  # kube-scheduler's density benchmark (single pods), as its project reports it
VOLCANO_PODS_PER_S = 1000  # "schedules up to 1000 pods per second" (Huawei Cloud CCE, Volcano scheduler)
NS = "bench"
CONFIG = ServiceConfig(heartbeat_interval_s=5.0, reap_interval_s=0.05)
PROBE_ANN = {"rollmux.io/gang-size": "2", "rollmux.io/slo": "1.0", "rollmux.io/t-roll-s": "10",
             "rollmux.io/t-train-s": "10"}


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class BoundWatch(threading.Thread):
    """Records when each pod of the namespace is first seen bound (a watch, as a controller sees it)."""

    def __init__(self, kube: KubeClient, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.kube, self.stop, self.bound_at = kube, stop, {}
        _, self.rv = kube.list(f"/api/v1/namespaces/{NS}/pods", limit=1)

    def run(self) -> None:
        while not self.stop.is_set():
            for _, obj in self.kube.watch(f"/api/v1/namespaces/{NS}/pods", self.rv, timeout_s=30):
                self.rv = obj["metadata"]["resourceVersion"]
                if obj["spec"].get("nodeName"):
                    self.bound_at.setdefault(obj["metadata"]["name"], time.perf_counter())


def crowd(kube: KubeClient, nodes: int) -> None:
    """`nodes` Node objects outside the fleet, each with a default-scheduler pod bound on it."""
    kube.create("/api/v1/namespaces", {"metadata": {"name": "crowd"}})
    for i in range(nodes):
        obj = node_obj(f"cpu-{i}", "none", gpus=0)
        obj["metadata"]["labels"] = {"kubernetes.io/hostname": f"cpu-{i}"}
        kube.create("/api/v1/nodes", obj)
        pod = pod_obj(f"web-{i}", None, gpus=0, ns="crowd", scheduler="default-scheduler",
                      requests={"cpu": "2", "memory": "4Gi"})
        kube.create("/api/v1/namespaces/crowd/pods", pod)
        kube.create(f"/api/v1/namespaces/crowd/pods/web-{i}/binding",
                    {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"web-{i}"},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": f"cpu-{i}"}})


def run_size(n: int, queued: int | None, pairs: int, rounds: int, nodes: int, workdir: Path) -> dict[str, Any]:
    plane = control_plane.ControlPlane(workdir / f"kube-{n}").start()
    kube = plane.client()
    srv = ThreadedServer(ServerOptions(config=CONFIG, http=None))
    assert srv.wait_ready(10), srv.core.not_ready_reason
    client = CoordinatorClient(srv.address, retry_s=10.0)
    sessions = []
    try:
        kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        t_crowd = time.perf_counter()
        crowd(kube, nodes)
        crowd_s = time.perf_counter() - t_crowd
        for i in range(pairs):
            for name, pool in ((f"r{i}", Pool.ROLLOUT), (f"t{i}", Pool.TRAIN)):
                kube.create("/api/v1/nodes", node_obj(name, pool.value))
                s = NodeSession(client, name, pool, gpu_type="H20" if pool is Pool.ROLLOUT else "H800", gpu_count=8,
                                host_dram_bytes=2 * 10**12, heartbeat_s=2.0).start()
                assert s.connected.wait(10)
                sessions.append(s)
        scheduler = Scheduler(kube, client, SchedulerConfig(resync_s=1.0))
        # `queued` jobs the coordinator holds in its admission queue (a training pod per node the fleet
        # has, and one more: never admitted) and N - queued whose gangs are incomplete (a pod still to come)
        waiting = {"rollmux.io/gang-size": str(pairs + 2), "rollmux.io/slo": "1.0", "rollmux.io/t-roll-s": "10",
                   "rollmux.io/t-train-s": "10"}
        queued = n if queued is None else min(queued, n)
        for j in range(n):
            pods = [("r", "rollout")] + [(f"t{k}", "train") for k in range(pairs + 1 if j < queued else 0)]
            for suffix, pool in pods:
                kube.create(f"/api/v1/namespaces/{NS}/pods", pod_obj(f"w{j}-{suffix}", f"w{j}", pool=pool, ns=NS,
                                                                      annotations=waiting))
        scheduler.start(timeout_s=120)
        loop = threading.Thread(target=scheduler.run, daemon=True)
        loop.start()
        deadline = time.monotonic() + 600
        t_fill = time.perf_counter()
        while len(client.cluster_state().pending) < queued:  # the queued jobs reached the admission queue
            assert time.monotonic() < deadline, "the waiting jobs did not all reach the coordinator"
            time.sleep(0.5)
        fill_s = time.perf_counter() - t_fill
        reg = scheduler.metrics.registry
        fill_sum = reg.get_sample_value("rollmux_scheduler_admit_seconds_sum") or 0.0
        fill_count = reg.get_sample_value("rollmux_scheduler_admit_seconds_count") or 0.0
        stop = threading.Event()
        watch = BoundWatch(kube, stop)
        watch.start()
        latencies: list[float] = []
        rates: list[float] = []
        for r in range(rounds):
            created: dict[str, float] = {}
            t_first = time.perf_counter()
            for i in range(pairs):
                job = f"p{r}-{i}"
                for pool in ("rollout", "train"):
                    kube.create(f"/api/v1/namespaces/{NS}/pods", pod_obj(f"{job}-{pool}", job, pool=pool, ns=NS,
                                                                          annotations=PROBE_ANN))
                created[job] = time.perf_counter()
            done = time.monotonic() + 60
            while not all(f"{j}-{p}" in watch.bound_at for j in created for p in ("rollout", "train")):
                assert time.monotonic() < done, f"round {r}: probes not bound within 60 s"
                time.sleep(0.002)
            last = 0.0
            for job, t0 in created.items():
                t_bound = max(watch.bound_at[f"{job}-rollout"], watch.bound_at[f"{job}-train"])
                latencies.append(t_bound - t0)
                last = max(last, t_bound)
            rates.append(pairs / (last - t_first))
            for job in created:  # the probes leave
                client.remove_job(f"{NS}.{job}")  # its name at the coordinator: <namespace>.<job>
                for pool in ("rollout", "train"):
                    kube.delete(f"/api/v1/namespaces/{NS}/pods/{job}-{pool}", gracePeriodSeconds=0)
            while any(j.job.startswith(f"{NS}.p{r}-") for j in client.cluster_state().jobs):
                time.sleep(0.05)
        stop.set()
        scheduler.stop()
        count = (reg.get_sample_value("rollmux_scheduler_admit_seconds_count") or 0.0) - fill_count
        total = (reg.get_sample_value("rollmux_scheduler_admit_seconds_sum") or 0.0) - fill_sum
        mean_admit = total / count if count else 0.0  # the probes' admissions, N jobs queued
        return {"n": n, "p50": statistics.median(latencies), "p99": quantile(latencies, 0.99),
                "max": max(latencies), "rate": statistics.median(rates), "admit_ms": 1e3 * mean_admit,
                "gangs": len(latencies), "queued": queued, "fill_s": fill_s, "nodes": nodes + 2 * pairs,
                "crowd_s": crowd_s}
    finally:
        for s in sessions:
            s.stop()
        client.close()
        srv.stop()
        plane.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="100,1000", help="waiting jobs, comma-separated")
    ap.add_argument("--queued", type=int, default=None,
                    help="of the pending jobs, how many wait in the coordinator's admission queue (default: all)")
    ap.add_argument("--nodes", type=int, default=2000,
                    help="Node objects outside the fleet, each with a default-scheduler pod bound on it")
    ap.add_argument("--pairs", type=int, default=5, help="rollout + training node pairs: probe gangs per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of probe gangs per size")
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 unless p99 <= {TARGET_P99_S:g} s and >= {TARGET_GANGS_PER_S:g} gangs/s at the "
                         "largest N")
    args = ap.parse_args()
    why = control_plane.missing()
    if why:
        print(f"k8s_scheduler: no Kubernetes control plane: {why}", file=sys.stderr)
        return 2
    sizes = [int(x) for x in args.jobs.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            rows.append(run_size(n, args.queued, args.pairs, args.rounds, args.nodes, Path(tmp)))
            print(f"[k8s_scheduler] {rows[-1]}", flush=True)
    print(f"\nRollMux scheduler on kube-apiserver {control_plane.KUBE_VERSION}: probe gangs of 2 pods, "
          f"{args.pairs} per round, {args.rounds} rounds; the pending jobs queued at the coordinator (any "
          "others incomplete gangs); fill s: until the last queued job reached the coordinator's queue; "
          f"{args.nodes} more Node objects, each with a default-scheduler pod")
    print(f"{'jobs pending':>12} {'nodes':>6} {'queued':>7} {'fill s':>7} {'gangs':>6} {'p50 s':>8} {'p99 s':>8} "
          f"{'max s':>8} {'gangs/s':>8} {'pods/s':>7} {'coordinator admit ms':>21}")
    for r in rows:
        print(f"{r['n']:>12} {r['nodes']:>6} {r['queued']:>7} {r['fill_s']:>7.1f} {r['gangs']:>6} {r['p50']:>8.3f} "
              f"{r['p99']:>8.3f} {r['max']:>8.3f} {r['rate']:>8.1f} {2 * r['rate']:>7.1f} {r['admit_ms']:>21.1f}")
    last = rows[-1]
    print(f"beside: kube-scheduler ~{KUBE_SCHEDULER_PODS_PER_S} pods/s (single pods, its density benchmark), "
          f"Volcano up to {VOLCANO_PODS_PER_S} pods/s (documented); RollMux {last['rate']:.1f} gangs/s "
          f"= {2 * last['rate']:.1f} pods/s = {2 * last['rate'] / KUBE_SCHEDULER_PODS_PER_S:.3f}x kube-scheduler's "
          f"pods/s, each gang admitted by the coordinator; target {TARGET_GANGS_PER_S:g} gangs/s")
    if args.check:
        fails = []
        if last["p99"] > TARGET_P99_S:
            fails.append(f"p99 {last['p99']:.3f} s > {TARGET_P99_S:g} s")
        if last["rate"] < TARGET_GANGS_PER_S:
            fails.append(f"{last['rate']:.1f} gangs/s < {TARGET_GANGS_PER_S:g}")
        if fails:
            print(f"FAIL at {last['n']} jobs, {last['nodes']} nodes: {'; '.join(fails)}", file=sys.stderr)
            return 1
        print(f"ok: p99 {last['p99']:.3f} s <= {TARGET_P99_S:g} s and {last['rate']:.1f} gangs/s >= "
              f"{TARGET_GANGS_PER_S:g} at {last['n']} jobs, {last['nodes']} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
