"""The coordinator's admission queue: registering N jobs when none of them fits, in process (no gRPC).

Every registration (and departure, and a node coming back) asks the admission to look at its queue
again. A fleet of 4 rollout and 2 training nodes holds one admitted job per training node; each queued
job asks for 3 training nodes, so none can be admitted on that fleet. The script times the
registrations (CPU seconds, one process), then the two departures (the capacity changed: the queue is
decided again, and still nothing fits), then a third training node joining, which must admit the
queue's head at once.

    python benchmarks/admission_queue.py [--jobs 100,1000] [--check]

--check exits non-zero unless registering the last jobs of the largest N costs at most 2x what the
first jobs of the smallest N cost per registration (no growth with the queue), and the node joining
admits the head of the queue.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollmux.core.model import Pool  # noqa: E402
from tests.coordinator.service.builders import TB, make_runtime, register  # noqa: E402

TAIL = 50  # registrations timed at the end of the queue


def run(n: int) -> dict[str, float]:
    rt, _ = make_runtime(4, 2)
    for k in range(2):  # one job per training node
        register(rt, f"fit{k}", nt=8, nr=8)
    assert not rt.state.pending(), "the fleet jobs were admitted"
    times: list[float] = []
    for j in range(n):
        t0 = time.process_time()
        register(rt, f"q{j}", nt=24, nr=8)  # 3 training nodes: never fits 2
        times.append(time.process_time() - t0)
    assert len(rt.state.pending()) == n
    t0 = time.process_time()
    for k in range(2):
        rt.remove_job(f"fit{k}", reason="done")
    depart_s = time.process_time() - t0
    assert len(rt.state.pending()) == n
    t0 = time.process_time()
    rt.register_node(node_id="t2", pool=Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * TB, nvml={})
    rt.node_connected("t2")
    join_s = time.process_time() - t0
    head_admitted = rt.state.jobs["q0"].state.value == "admitted"
    return {"n": n, "total_s": sum(times), "first_ms": 1e3 * sum(times[:TAIL]) / min(TAIL, n),
            "last_ms": 1e3 * sum(times[-TAIL:]) / min(TAIL, n), "depart_ms": 1e3 * depart_s,
            "join_ms": 1e3 * join_s, "head": float(head_admitted)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="100,1000", help="queue sizes, comma-separated")
    ap.add_argument("--check", action="store_true", help="exit non-zero unless the cost per registration stays flat")
    args = ap.parse_args()
    print("registering N queued jobs that do not fit (CPU time, one process)")
    print(f"{'N':>6} {'total s':>9} {'first ms/job':>13} {'last ms/job':>12} {'2 departures ms':>16} "
          f"{'node joins ms':>14} {'head admitted':>14}")
    rows = []
    for n in args.jobs.split(","):
        rows.append(r := run(int(n)))
        print(f"{r['n']:>6} {r['total_s']:>9.2f} {r['first_ms']:>13.3f} {r['last_ms']:>12.3f} {r['depart_ms']:>16.1f} "
              f"{r['join_ms']:>14.1f} {'yes' if r['head'] else 'no':>14}", flush=True)
    if not args.check:
        return 0
    flat = rows[-1]["last_ms"] <= 2 * max(rows[0]["first_ms"], 0.05)
    ok = flat and all(r["head"] for r in rows)
    print(f"check: last ms/job at N={rows[-1]['n']} <= 2x first ms/job at N={rows[0]['n']}: {flat}; "
          f"the node joining admits the head: {all(r['head'] for r in rows)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
