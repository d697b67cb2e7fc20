"""Multiplexing on CPU: one rollout-heavy and one train-heavy tiny GRPO job, solo vs through RollMux.

    python benchmarks/multiplex_cpu.py [--iterations 30] [--check]

* Solo-disaggregated: each job alone with its own two cores (run one after the other: rollout
  worker on core 0, trainer on core 1, no RollMux), as a job owning a rollout and a training GPU.
* Multiplexed: both jobs at once through an embedded coordinator and two sidecars, rollout pool =
  core 0, training pool = core 1, every phase gated by a RollMux permit.

Prints throughput per core (iterations/s/core; solo counts 2 cores per job) and each job's
slowdown (multiplexed iteration period / solo), measured in the window where both jobs run, and
work conservation from the phase records (``rollmux.demo.conservation``): node-seconds a core sat
idle while a phase that may run there waited, and each handoff's share of it.
Targets (paper: 5-9 % slowdown): throughput per core >= 1.7x, per-job slowdown <= 1.15x; handoff
p50 <= 10 ms and p99 <= 50 ms, idle while a phase waited <= 2% of the window. The handoff targets
are what a permit boundary costs on two shared cores (a release, a grant, two local gRPC hops and a
store commit: a few ms) with room for the scheduler's jitter; 2% is what phases of 0.1-0.6 s can
lose to that at ~4 handoffs per second per core. No asserts by default; ``--check`` exits 1 below
target. Seeds are fixed; wall-clock numbers depend on machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollmux.demo.conservation import describe, work_json
from rollmux.demo.launch import JobKnobs, LocalCluster, Pools, interrupt_safe, read_jsonl
from rollmux.demo.report import Summary, solo_iteration_s, solo_phase_s, summarize

JOBS = (
    JobKnobs(name="rollout-heavy", iterations=0, seed=1,
             flags=("--max-new-tokens", "24", "--prompts", "14", "--group-size", "8", "--train-epochs", "1",
                    "--minibatches", "1")),
    JobKnobs(name="train-heavy", iterations=0, seed=2,
             flags=("--max-new-tokens", "18", "--prompts", "6", "--group-size", "8", "--train-epochs", "6",
                    "--minibatches", "4")),
)
TARGET_RATIO, TARGET_SLOWDOWN = 1.7, 1.15
TARGET_P50_MS, TARGET_P99_MS, TARGET_IDLE_SHARE = 10.0, 50.0, 0.02


def _wait(jobs: list, what: str) -> None:  # type: ignore[type-arg]
    while any(j.poll() is None for j in jobs):
        time.sleep(0.2)
    bad = {j.knobs.name: j.poll() for j in jobs if j.poll()}
    if bad:
        raise SystemExit(f"{what}: jobs failed {bad}")


def run_round(cluster: LocalCluster, out: Path, jobs: tuple[JobKnobs, ...], args: argparse.Namespace) -> Summary:
    """Solo-disaggregated (one job after the other, both cores each), then both jobs multiplexed."""
    solo, phases = {}, {}
    for k in jobs:
        job = cluster.launch(replace(k, iterations=args.solo_iterations), token=None, tag="-solo")
        _wait([job], "solo")
        recs = job.records()
        solo[k.name] = solo_iteration_s(recs)
        phases[k.name] = (solo_phase_s(recs, "rollout"), solo_phase_s(recs, "train") + solo_phase_s(recs, "sync"))
        print(f"solo {k.name}: {solo[k.name]:.3f} s/it (rollout {phases[k.name][0]:.3f} s, "
              f"train+sync {phases[k.name][1]:.3f} s)", flush=True)
    tokens = {k.name: cluster.register(k, t_roll_s=phases[k.name][0], t_train_s=phases[k.name][1], slo=4.0)
              for k in jobs}
    pending = [j.job for j in cluster.client.cluster_state().jobs if j.state != "admitted"]
    if pending:
        raise SystemExit(f"the policy did not admit {pending} next to the other job; nothing to compare")
    running = [cluster.launch(replace(k, iterations=args.iterations), tokens[k.name]) for k in jobs]
    _wait(running, "multiplexed")
    names = {k.name for k in jobs}
    mine = [r for r in read_jsonl(out / "phases.jsonl") if r["job"] in names]
    s = summarize(solo, mine)
    print(f"rollmux: {', '.join(f'{j} {t:.3f} s/it' for j, t in s.mux_s.items())} -> {s.ratio:.2f}x", flush=True)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=30, help="iterations per job (solo and multiplexed)")
    ap.add_argument("--solo-iterations", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for logs and phase records (default: a temp dir)")
    ap.add_argument("--gantt", action="store_true", help="also draw out/gantt.png")
    ap.add_argument("--rounds", type=int, default=1, help="solo + multiplexed rounds (the median is reported)")
    ap.add_argument("--check", action="store_true", help="exit 1 below the targets")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="rollmux-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*.jsonl"):
        f.unlink()
    # Both jobs must share the two cores whatever the (noisy) solo times say: this measures the
    # execution plane, so admission is made permissive (generous SLO, packing into a saturated group).
    rounds = []
    with interrupt_safe(), LocalCluster(out, pools=Pools(), fill_saturated=True) as cluster:
        for rnd in range(args.rounds):  # rounds alternate solo and multiplexed runs under similar load
            jobs_r = tuple(replace(k, name=f"{k.name}-{rnd}") for k in JOBS)
            rounds.append(run_round(cluster, out, jobs_r, args))
    for i, s in enumerate(rounds):
        print(f"\nround {i}: {'job':<15}{'solo s/it':>11}{'rollmux s/it':>14}{'slowdown':>10}")
        for j in s.solo_s:
            print(f"         {j:<15}{s.solo_s[j]:>11.3f}{s.mux_s[j]:>14.3f}{s.slowdown[j]:>9.2f}x")
        print(f"         throughput per core: solo-disaggregated {s.solo_per_core:.3f} it/s/core, rollmux "
              f"{s.mux_per_core:.3f} it/s/core -> {s.ratio:.2f}x; worst slowdown {max(s.slowdown.values()):.2f}x")
        print(f"         busy: rollout core {s.busy['rollout']:.0%}, train core {s.busy['train']:.0%}; CPU share of "
              f"phase bodies {s.cpu_share:.0%}; overlapping phases {s.overlaps}, order violations "
              f"{s.order_problems}; window {s.window_s:.1f}s")
        if s.work is not None:
            print(f"         {describe(s.work)}")
    ratio = statistics.median(s.ratio for s in rounds)
    worst = statistics.median(max(s.slowdown.values()) for s in rounds)
    p50 = statistics.median(s.work.quantile_ms(0.5) for s in rounds if s.work)
    p99 = statistics.median(s.work.quantile_ms(0.99) for s in rounds if s.work)
    idle = statistics.median(s.work.idle_runnable_share for s in rounds if s.work)
    load = os.getloadavg()
    print(f"\nmedian over {len(rounds)} round(s): throughput per core {ratio:.2f}x (target >= {TARGET_RATIO}x), "
          f"worst per-job slowdown {worst:.2f}x (target <= {TARGET_SLOWDOWN}x)")
    print(f"work conservation: handoff p50 {p50:.1f} ms (target <= {TARGET_P50_MS:g}), p99 {p99:.1f} ms (target <= "
          f"{TARGET_P99_MS:g}), idle while a phase waited {idle:.1%} of the window (target <= {TARGET_IDLE_SHARE:.0%})")
    print(f"load average now {load[0]:.1f} / {load[1]:.1f} (1 / 5 min) on {os.cpu_count()} CPUs. A CPU share of "
          "phase bodies well below 100% means other processes ran on the pinned cores during the phases.")
    (out / "multiplex_cpu.json").write_text(json.dumps(
        {"rounds": [{"solo_s": s.solo_s, "mux_s": s.mux_s, "ratio": s.ratio, "slowdown": s.slowdown,
                     "busy": s.busy, "cpu_share": s.cpu_share, **(work_json(s.work) if s.work else {})}
                    for s in rounds],
         "median_ratio": ratio, "median_worst_slowdown": worst, "median_handoff_p50_ms": p50,
         "median_handoff_p99_ms": p99, "median_idle_while_runnable_share": idle, "loadavg": load}, indent=2))
    last = f"-{len(rounds) - 1}"
    records = [r for r in read_jsonl(out / "phases.jsonl") if r["job"].endswith(last)]
    if args.gantt:
        from rollmux.demo.report import gantt

        print("gantt:", gantt(records, out / "gantt.png", title="multiplex_cpu: rollout-heavy + train-heavy"))
    print(f"records: {out}")
    ok = (ratio >= TARGET_RATIO and worst <= TARGET_SLOWDOWN and all(s.overlaps == 0 for s in rounds)
          and p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS and idle <= TARGET_IDLE_SHARE)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
