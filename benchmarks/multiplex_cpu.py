"""Multiplexing on CPU: one rollout-heavy and one train-heavy tiny GRPO job, solo vs through RollMux.

    python benchmarks/multiplex_cpu.py [--iterations 30] [--check]

* Solo-disaggregated: each job alone with its own two cores (run one after the other: rollout
  worker on core 0, trainer on core 1, no RollMux), as a job owning a rollout and a training GPU.
* Multiplexed: both jobs at once through an embedded coordinator and two sidecars, rollout pool =
  core 0, training pool = core 1, every phase gated by a RollMux permit.

Prints throughput per core (iterations/s/core; solo counts 2 cores per job) and each job's
slowdown (multiplexed iteration period / solo), measured in the window where both jobs run.
Targets (paper: 5-9 % slowdown): throughput per core >= 1.7x, per-job slowdown <= 1.15x. No asserts by
default; ``--check`` exits 1 below target. Seeds are fixed; wall-clock numbers depend on machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollmux.sidecar.launch import JobKnobs, LocalCluster, Pools, interrupt_safe, read_jsonl
from rollmux.sidecar.report import solo_iteration_s, solo_phase_s, summarize

JOBS = (
    JobKnobs(name="rollout-heavy", iterations=0, seed=1,
             flags=("--max-new-tokens", "24", "--prompts", "12", "--group-size", "8", "--train-epochs", "1",
                    "--minibatches", "1")),
    JobKnobs(name="train-heavy", iterations=0, seed=2,
             flags=("--max-new-tokens", "14", "--prompts", "6", "--group-size", "8", "--train-epochs", "5",
                    "--minibatches", "4")),
)
TARGET_RATIO, TARGET_SLOWDOWN = 1.7, 1.15


def _wait(jobs: list, what: str) -> None:  # type: ignore[type-arg]
    while any(j.poll() is None for j in jobs):
        time.sleep(0.2)
    bad = {j.knobs.name: j.poll() for j in jobs if j.poll()}
    if bad:
        raise SystemExit(f"{what}: jobs failed {bad}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=30, help="iterations per job (solo and multiplexed)")
    ap.add_argument("--solo-iterations", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for logs and phase records (default: a temp dir)")
    ap.add_argument("--gantt", action="store_true", help="also draw out/gantt.png")
    ap.add_argument("--check", action="store_true", help="exit 1 below the targets")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="rollmux-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*.jsonl"):
        f.unlink()
    with interrupt_safe(), LocalCluster(out, pools=Pools()) as cluster:
        solo, phases = {}, {}
        for k in JOBS:  # solo-disaggregated: one after the other, each with both cores
            job = cluster.launch(replace(k, iterations=args.solo_iterations), token=None, tag="-solo")
            _wait([job], "solo")
            recs = job.records()
            solo[k.name] = solo_iteration_s(recs)
            phases[k.name] = (solo_phase_s(recs, "rollout"), solo_phase_s(recs, "train") + solo_phase_s(recs, "sync"))
            print(f"solo {k.name}: {solo[k.name]:.3f} s/it (rollout {phases[k.name][0]:.3f} s, "
                  f"train+sync {phases[k.name][1]:.3f} s)", flush=True)
        running = []
        for k in JOBS:
            token = cluster.register(k, t_roll_s=phases[k.name][0], t_train_s=phases[k.name][1], slo=2.0)
            running.append((replace(k, iterations=args.iterations), token))
        jobs = [cluster.launch(k, t) for k, t in running]
        _wait(jobs, "multiplexed")
    records = read_jsonl(out / "phases.jsonl")
    s = summarize(solo, records)
    print(f"\n{'job':<15}{'solo s/it':>11}{'rollmux s/it':>14}{'slowdown':>10}")
    for j in solo:
        print(f"{j:<15}{s.solo_s[j]:>11.3f}{s.mux_s[j]:>14.3f}{s.slowdown[j]:>9.2f}x")
    print(f"\nthroughput per core: solo-disaggregated {s.solo_per_core:.3f} it/s/core, rollmux {s.mux_per_core:.3f} "
          f"it/s/core -> {s.ratio:.2f}x (target >= {TARGET_RATIO}x)")
    print(f"worst per-job slowdown {max(s.slowdown.values()):.2f}x (target <= {TARGET_SLOWDOWN}x); "
          f"busy: rollout core {s.busy['rollout']:.0%}, train core {s.busy['train']:.0%}; "
          f"overlapping phases {s.overlaps}, order violations {s.order_problems}; window {s.window_s:.1f}s")
    (out / "multiplex_cpu.json").write_text(json.dumps({"solo_s": s.solo_s, "mux_s": s.mux_s, "ratio": s.ratio,
                                                         "slowdown": s.slowdown, "busy": s.busy,
                                                         "cpu_share": s.cpu_share, "loadavg": os.getloadavg()}, indent=2))
    if args.gantt:
        from rollmux.sidecar.report import gantt

        print("gantt:", gantt(records, out / "gantt.png", title="multiplex_cpu: rollout-heavy + train-heavy"))
    load = os.getloadavg()
    print(f"CPU share of multiplexed phase bodies: {s.cpu_share:.0%} (CPU time / wall time; below ~90% means other "
          f"processes ran on the pinned cores); load average now {load[0]:.1f} / {load[1]:.1f} (1 / 5 min) "
          f"on {os.cpu_count()} CPUs")
    print(f"records: {out}")
    ok = s.ratio >= TARGET_RATIO and max(s.slowdown.values()) <= TARGET_SLOWDOWN and s.overlaps == 0
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
