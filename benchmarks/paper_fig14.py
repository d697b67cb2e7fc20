"""Paper Fig. 14: cost normalised to the offline optimum, and SLO attainment, under sweeps.

Each setting draws `--instances` random batches of `--jobs` jobs (paper Table 6 profiles, all
known at once), places them with RollMux, Random and Greedy (Most-Idle), and divides each
policy's $/h by the optimal partition's. SLO attainment is planned (worst-case round-robin
schedule against SLO x T_solo). Sweeps: (a) workload type, (b) SLO, (c) max group size.

Two costs are printed. "$/h" is the provisioned price of the placed batch, a snapshot: by it the
SLO-blind baselines look cheaper than Opt, because they pack past the SLOs and slow every member
down. "$/work" divides by the throughput the jobs get (T_solo / T_coexec each), i.e. it charges
the slowdown that a trace replay charges through longer occupancy. In $/h the baselines come out
below Opt here, so the paper's baseline figures (1.4-2.2x Opt) must charge the slowdown in some
form. Opt minimises $/h, not $/work, so RollMux can land just under 1.00x in the $/work column.

    python benchmarks/paper_fig14.py [--instances 10] [--jobs 8] [--check]

--check exits non-zero when RollMux's mean cost is above 1.05x Opt in any setting, or its
attainment is below 100%.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from rich.console import Console
from rich.table import Table

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.experiments import STATIC_POLICIES, static_instance
from rollmux.coordinator.sim.trace import to_job_specs
from rollmux.coordinator.sim.workload import generate
from rollmux.core.model import ClusterSpec

PAPER = {  # paper Fig. 14 ranges (cost x Opt, SLO attainment)
    "workload": "RollMux 1.01-1.12x, 100%; Random 1.72-2.00x, 37-58%; Greedy 1.38-1.89x, 42-61%",
    "slo": "RollMux 100%; baselines 1.59-2.09x Opt; Random/Greedy 38%/43% (1.2) .. 71%/73% (2.0)",
    "group size": "RollMux flat; baselines 1.59-2.15x Opt, 48-61% SLO",
}


def run_setting(workload: str, slo: str, size: int, instances: int, jobs: int) -> dict[str, tuple[float, float, float]]:
    """policy -> (mean $/h x Opt, mean $/work x Opt, mean planned SLO attainment)."""
    cluster = ClusterSpec()
    config = PolicyConfig(max_group_size=size)
    ratios: dict[str, list[float]] = {p: [] for p in STATIC_POLICIES}
    work: dict[str, list[float]] = {p: [] for p in STATIC_POLICIES}
    slos: dict[str, list[float]] = {p: [] for p in STATIC_POLICIES}
    for seed in range(instances):
        specs = list(to_job_specs(generate(workload, jobs, seed=1000 + seed, slo=slo), cluster).values())
        res = static_instance(specs, cluster, config, seed=seed)
        for p in STATIC_POLICIES:
            ratios[p].append(res[p].usd_per_h / res["opt"].usd_per_h)
            work[p].append(res[p].usd_per_work / res["opt"].usd_per_work)
            slos[p].append(res[p].slo_attainment)
    return {p: (statistics.mean(ratios[p]), statistics.mean(work[p]), statistics.mean(slos[p])) for p in STATIC_POLICIES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=10, help="random instances per setting [10]")
    ap.add_argument("--jobs", type=int, default=8, help="jobs per instance (<= 14 for Opt) [8]")
    ap.add_argument("--check", action="store_true", help="exit 1 if RollMux misses 1.05x Opt or 100%% SLO")
    args = ap.parse_args(argv)
    settings = ([("workload", w, w, "U(1,2)", 5) for w in ("balanced", "rollout-heavy", "train-heavy", "mixed")]
                + [("slo", s, "mixed", s, 5) for s in ("1.2", "1.5", "2.0", "U(1,2)")]
                + [("group size", str(g), "mixed", "U(1,2)", g) for g in (2, 3, 4, 5)])
    console = Console(width=150)
    table = Table(title=f"Fig. 14: mean cost x Opt and planned SLO attainment ({args.instances} instances x {args.jobs} jobs)")
    names = ("RollMux", "Random", "Greedy")
    for col in ("sweep", "setting", *(f"{n} $/h" for n in names), *(f"{n} $/work" for n in names),
                *(f"SLO {n}" for n in names)):
        table.add_column(col, justify="left" if col in ("sweep", "setting") else "right")
    worst = 0.0
    min_slo = 1.0
    for sweep, label, workload, slo, size in settings:
        r = run_setting(workload, slo, size, args.instances, args.jobs)
        worst = max(worst, r["rollmux"][0])
        min_slo = min(min_slo, r["rollmux"][2])
        table.add_row(sweep, label, *(f"{r[p][0]:.2f}x" for p in STATIC_POLICIES),
                      *(f"{r[p][1]:.2f}x" for p in STATIC_POLICIES), *(f"{100 * r[p][2]:.0f}%" for p in STATIC_POLICIES))
    console.print(table)
    for sweep, text in PAPER.items():
        console.print(f"paper ({sweep}): {text}")
    ok = worst <= 1.05 and min_slo >= 1.0
    console.print(f"target: RollMux mean cost <= 1.05x Opt in every setting (worst {worst:.3f}x) and 100% SLO "
                  f"(min {100 * min_slo:.1f}%): {'MET' if ok else 'MISSED'}")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
