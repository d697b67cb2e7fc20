"""Decision latency of the placement policy vs the number of concurrent jobs (paper Table 5).

For each N, fill a cluster with N concurrent jobs (mixed Table 6 workload), then time the
placement of arriving jobs one by one while an equal number depart, so the cluster stays at N.
Prints median and p99 latency per N beside the paper's figures, and the offline optimum's
latency at 5, 9 and 13 jobs. With every policy mechanism on (the default), an arrival's decision
is the placement plus the regrouping plan for the arrived job (`regroup.place_arrival`: one pass
over the fleet, pair merges included); `--no-regroup` times the placement alone, `--no-modes` the paper's Algorithm 1.

    python benchmarks/placement_latency.py --jobs 5,9,13,100,500,1000,2000,5000 [--no-regroup] [--no-modes] [--check]

With `--pending K` (8 by default) it also times, at 2,000 jobs, the admission of a job with K jobs
pending behind it (`admission.place_pending`'s lookahead, capped at `LOOKAHEAD_PLACEMENTS`).

--check exits non-zero unless p99 <= 10 ms at 2,000 jobs, for an arrival and for an admission with
jobs pending, and latency grows no worse than linearly (p99 at the largest N over p99 at the smallest
N >= 100 stays within 1.5x of N's ratio).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _policy_jobs import mixed_jobs  # noqa: E402

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy  # noqa: E402
from rollmux.coordinator.policy.admission import place_pending  # noqa: E402
from rollmux.coordinator.policy.flags import add_mechanism_flags, mechanisms_on  # noqa: E402
from rollmux.coordinator.policy.optimum import optimal_partition  # noqa: E402
from rollmux.coordinator.policy.regroup import apply_moves, place_arrival, place_batch  # noqa: E402

PAPER_MS = {5: 5.6, 9: 6.5, 13: 7.6, 100: 41.9, 500: 198, 1000: 318, 2000: 591}
PAPER_OPT_MS = {5: 113.0, 9: "> 1 min", 13: "> 5 h"}
TARGET_P99_MS_AT_2000 = 10.0
REMAINING_S = 36_000.0  # every job has 10 h of work left: moves are worth considering


def measure(n: int, probes: int, seed: int, config: PolicyConfig) -> list[float]:
    """Latencies (ms) of `probes` arrival decisions into a cluster holding `n` jobs."""
    policy = RollMuxPolicy(config)
    state = ClusterState()
    jobs = mixed_jobs(n, seed)
    place_batch(jobs, state, policy)
    rng = random.Random(seed + 1)
    alive = [j.name for j in jobs]
    out = []
    for job in mixed_jobs(probes, seed + 2, prefix="probe"):
        t0 = time.perf_counter()
        if config.regroup:  # placement and its plan in one pass (as the simulator's arrival)
            _, _, moves = place_arrival(state, policy, job, lambda _: REMAINING_S)
            out.append((time.perf_counter() - t0) * 1e3)
        else:
            decision = policy.place(job, state)
            out.append((time.perf_counter() - t0) * 1e3)
            state.apply(job, decision)
            moves = []
        apply_moves(state, moves)
        alive.append(job.name)
        state.remove_job(alive.pop(rng.randrange(len(alive) - 1)))
    return out


def measure_pending(n: int, pending: int, probes: int, seed: int, config: PolicyConfig) -> list[float]:
    """Latencies (ms) of admission decisions with `pending` jobs waiting behind each
    (`admission.place_pending`, what the live admission calls), into a cluster holding `n` jobs."""
    policy, state = RollMuxPolicy(config), ClusterState()
    place_batch(mixed_jobs(n, seed), state, policy)
    queue = mixed_jobs(probes + pending, seed + 3, prefix="queued")
    out = []
    for i in range(probes):
        t0 = time.perf_counter()
        place_pending(policy, queue[i], state, queue[i + 1:i + 1 + pending])
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) > 1 else xs[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="5,9,13,100,500,1000,2000,5000", help="comma-separated concurrent job counts")
    ap.add_argument("--probes", type=int, default=300, help="placements timed per N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-opt", action="store_true", help="skip the offline optimum's latency")
    add_mechanism_flags(ap, only=("regroup", "modes"))  # off: the placement alone; the paper's Algorithm 1
    ap.add_argument("--pending", type=int, default=8,
                    help="also time admission with this many jobs pending behind each at 2,000 jobs (checked "
                         "with --check; 0: skip)")
    ap.add_argument("--check", action="store_true", help="exit non-zero below target")
    args = ap.parse_args()
    # Every mechanism on, as `rollmux simulate` runs it (work-aware check, best of the three moves).
    config = PolicyConfig.simulator(**mechanisms_on(args))
    print(f"policy: modes={config.modes} regroup={config.regroup} work_aware={config.work_aware} best_move={config.best_move}")
    ns = [int(x) for x in args.jobs.split(",")]
    rows = {}
    print(f"{'jobs':>6} {'median ms':>10} {'p99 ms':>8} {'paper ms':>9} {'paper/ours p99':>15} {'opt ms':>10} {'paper opt':>10}")
    for n in ns:
        lat = measure(n, args.probes, args.seed, config)
        med, tail = statistics.median(lat), p99(lat)
        rows[n] = tail
        paper = PAPER_MS.get(n)
        opt_ms = ""
        if not args.no_opt and n in PAPER_OPT_MS:
            t0 = time.perf_counter()
            optimal_partition(mixed_jobs(n, args.seed, sizes="S"))
            opt_ms = f"{(time.perf_counter() - t0) * 1e3:.1f}"
        print(f"{n:>6} {med:>10.3f} {tail:>8.3f} {paper if paper else '-':>9} "
              f"{(f'{paper / tail:.0f}x' if paper else '-'):>15} {opt_ms or '-':>10} {PAPER_OPT_MS.get(n, '-')!s:>10}",
              flush=True)
    ok = True
    if args.pending and 2000 in ns:
        lat = measure_pending(2000, args.pending, min(args.probes, 100), args.seed, config)
        met = p99(lat) <= TARGET_P99_MS_AT_2000
        print(f"admission with {args.pending} jobs pending behind it at 2000 jobs (lookahead): "
              f"median {statistics.median(lat):.1f} ms, p99 {p99(lat):.1f} ms -> {'met' if met else 'MISSED'}")
        ok &= met
    if 2000 in rows:
        met = rows[2000] <= TARGET_P99_MS_AT_2000
        print(f"target p99 <= {TARGET_P99_MS_AT_2000} ms at 2000 jobs: {rows[2000]:.2f} ms -> {'met' if met else 'MISSED'}")
        ok &= met
    big = [n for n in ns if n >= 100]
    if len(big) >= 2:
        lo, hi = min(big), max(big)
        growth, linear = rows[hi] / rows[lo], hi / lo
        met = growth <= 1.5 * linear
        print(f"growth {lo}->{hi} jobs: p99 x{growth:.2f} vs linear x{linear:.0f} -> {'met' if met else 'MISSED'}")
        ok &= met
    return 0 if (ok or not args.check) else 1


if __name__ == "__main__":
    sys.exit(main())
