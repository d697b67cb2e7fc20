"""RollMux's online placement cost over the offline optimum on random small instances.

Each instance is `--jobs` jobs of the paper's mixed Table 6 workload (SLO ~ U(1,2)), all present
at once; RollMux places them one by one in arrival order, the optimum partitions them knowing all
of them. Prints the cost ratio per instance summary (mean, max) beside the paper's 1.01-1.12x
(mean 1.06x) for its simulations.

    python benchmarks/optimality_gap.py --instances 50 --jobs 8 [--check]

--check exits non-zero unless the mean ratio is <= 1.05.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _policy_jobs import mixed_jobs  # noqa: E402

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy  # noqa: E402
from rollmux.coordinator.policy.optimum import optimal_partition  # noqa: E402

TARGET_MEAN = 1.05


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=50, help="random instances")
    ap.add_argument("--jobs", type=int, default=8, help="jobs per instance (<= 14)")
    ap.add_argument("--sizes", default="SML", help="size classes to draw from (S, M, L)")
    ap.add_argument("--max-group-size", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algorithm1", action="store_true",
                    help="prune saturated groups as the paper's Algorithm 1 does (default: pack them when SLOs allow)")
    ap.add_argument("--check", action="store_true", help=f"exit non-zero if the mean ratio > {TARGET_MEAN}")
    args = ap.parse_args()
    config = PolicyConfig(max_group_size=args.max_group_size, fill_saturated=not args.algorithm1)
    ratios = []
    t_opt = 0.0
    for i in range(args.instances):
        jobs = mixed_jobs(args.jobs, args.seed * 100_003 + i, sizes=args.sizes)
        state = ClusterState()
        policy = RollMuxPolicy(config)
        for job in jobs:
            state.apply(job, policy.place(job, state))
        t0 = time.perf_counter()
        opt = optimal_partition(jobs, state.cluster, config).usd_per_h
        t_opt += time.perf_counter() - t0
        ratios.append(state.usd_per_h / opt)
        print(f"\r[{'algorithm-1' if args.algorithm1 else 'fill-saturated'}] instance {i + 1}/{args.instances}: rollmux ${state.usd_per_h:.2f}/h, opt ${opt:.2f}/h, "
              f"ratio {ratios[-1]:.3f}", end="", flush=True)
    print()
    mean, worst = statistics.mean(ratios), max(ratios)
    at_opt = sum(r <= 1 + 1e-9 for r in ratios)
    print(f"RollMux cost / optimum over {args.instances} instances of {args.jobs} jobs: "
          f"mean {mean:.3f}x, max {worst:.3f}x, optimal in {at_opt}/{args.instances} "
          f"(paper: 1.01-1.12x, mean 1.06x); optimum solve time {t_opt / args.instances * 1e3:.0f} ms/instance")
    met = mean <= TARGET_MEAN
    print(f"target mean <= {TARGET_MEAN}x: {'met' if met else 'MISSED'}")
    return 0 if (met or not args.check) else 1


if __name__ == "__main__":
    sys.exit(main())
