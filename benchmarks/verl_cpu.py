"""Real veRL 0.9.1 GRPO jobs on the CPU harness: opted in to RollMux vs not, and two jobs multiplexed
vs run one after the other.

    flock /tmp/rollmux-heavy.lock .venv/bin/python benchmarks/verl_cpu.py [--pairs 5] [--steps 4] [--check]

Needs a source checkout (the harness lives in tests/adapters/verl/harness/) and
``bash scripts/setup.sh --dev`` (veRL 0.9.1, redis-server). One RollMux setup (Redis, the coordinator,
one sidecar per pool) runs for the whole invocation, so plain and opted-in runs see the same background.
The runs, one after the other (about 14 minutes with the defaults):

1. ``--pairs`` rounds of job A not opted in (the variable unset) and job A opted in alone, the order
   alternating between rounds (unset first, then opted in first, ...), so a drift in the machine's load
   during the invocation falls on both sides. Per-step overhead besides offload/reload =
   (median opted-in step - offload - reload - median unset step) / median unset step, target <= 3 %.
   The medians are over every measured step of every run of that kind (all of them: no sample is
   dropped); offload + reload is the mean per step over the opted-in runs. The spread is printed
   beside it: the quartiles of each side's steps, each round's own overhead (its two runs' medians),
   a 90 % bootstrap interval of the overhead (rounds resampled, seed 0) and the CPUs the machine was
   busy during each run (``/proc/stat``, the job itself included: other work on a shared box shows
   there). A step is about 2.2 s (2.0 s of it veRL's replay-buffer poll) and varies by 0.05-0.4 s; more
   than that, a whole run is slower or faster with the load of its minute, so the rounds, not the
   steps, are what average it out: many short runs (``--steps 4``, 3 measured) rather than few long.
   The offload/reload (veRL's worker ``to("cpu")`` / ``to("device")`` between sync and the next train
   phase) is reported on its own, with GB/s = state bytes / measured seconds. The seconds are the
   adapter's own measurements (its ``offload``/``reload`` records); the bytes are derived from the model
   file (fp32 parameters, gradients and two Adam moments), not counted inside the worker. On this CPU
   box the state already lives in host memory, so that figure is the cost of the RPC, not a copy rate.
   Beside it, RollMux's ``StateCache`` offloads and reloads the same state (the model file loaded with
   transformers, gradients and AdamW moments after one step) in this process, on one thread as the
   job's workers run: the other path the adapter could take, timed on the same bytes (median of
   ``--cache-repeats``; it leaves out the RPC into veRL's worker that the adapter would need to run it);
   ``benchmarks/verl_offload.py`` compares both paths on an FSDP2-sharded state, on a GPU where one is;
2. job B not opted in: with job A's unset runs the *sequential* baseline (makespan = median wall of
   A unset + wall of B unset);
3. jobs A and B multiplexed (started together, both opted in): makespan ratio (target < 1), per-job
   slowdown (median multiplexed step / median unset step) and the busy fraction of each pool from the
   phase records, next to the busy fraction of job A alone (its first opted-in run).

Step times are veRL's own ``timing_s/step`` of the steps after the first (warm-up; with ``--steps 1``
the only step is used). Everything comes from this one invocation; wall-clock figures depend on the
machine's load (printed at the end). ``--check`` exits 1 when a target is missed or a job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "adapters" / "verl" / "harness"
TARGET_OVERHEAD, TARGET_MAKESPAN = 0.03, 1.0
STATE_COPIES = 4  # parameters, gradients, Adam exp_avg and exp_avg_sq (fp32 each)
BOOTSTRAP_ROUNDS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One finished job: veRL's step times and what the adapter recorded for it."""

    name: str
    rc: int
    wall_s: float
    steps_s: tuple[float, ...] = ()  # timing_s/step of each measured step (after the warm-up)
    offload_s: float = 0.0  # mean adapter-measured offload per step
    reload_s: float = 0.0  # mean adapter-measured reload per step
    permit_s: float = 0.0  # mean time per step in the phase gates (acquire + release, adapter-measured)
    gates: tuple[tuple[str, float, float], ...] = ()  # (phase, mean acquire s, mean release s) per phase
    timings: tuple[tuple[str, tuple[float, ...]], ...] = ()  # veRL's timing_s/* of each measured step
    busy_cores: float = float("nan")  # mean CPUs busy on the machine during the run (this job included)
    steal_cores: float = float("nan")  # mean CPUs stolen by the hypervisor during the run

    @property
    def step_s(self) -> float:
        """Median measured step (s)."""
        return statistics.median(self.steps_s) if self.steps_s else float("nan")

    @property
    def moved_s(self) -> float:
        """Offload + reload per step (s)."""
        return self.offload_s + self.reload_s


def _harness() -> tuple[Any, Any, Any]:
    if not (HARNESS / "scenario.py").exists():
        raise SystemExit(f"benchmarks/verl_cpu.py needs a source checkout: {HARNESS} is missing")
    sys.path.insert(0, str(HARNESS))
    import assets
    import job
    import scenario

    return assets, job, scenario


def measured_timings(step_metrics: dict[int, dict[str, float]]) -> dict[str, tuple[float, ...]]:
    """Each ``timing_s/*`` of the steps after the first (the only one if there is one), in step order."""
    steps = sorted(step_metrics)
    if not steps:
        raise SystemExit("veRL printed no step metrics: see the job.log named above")
    used = [step_metrics[s] for s in steps[1:] or steps]
    keys = [k for k in used[0] if k.startswith("timing_s/") and all(k in m for m in used)]
    return {k.removeprefix("timing_s/"): tuple(m[k] for m in used) for k in keys}


def cpu_ticks() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of all CPUs so far (``/proc/stat``; zeros where it is missing)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0, 0, 0
    total = sum(v)
    return total - v[3] - v[4], v[7], total


def overhead(unset_s: Sequence[float], opted_s: Sequence[float], moved_s: float) -> float:
    """(median opted-in step - offload/reload - median unset step) / median unset step."""
    base = statistics.median(unset_s)
    return (statistics.median(opted_s) - moved_s - base) / base


def bootstrap(unset: Sequence[Run], alone: Sequence[Run], moved_s: float) -> tuple[float, float]:
    """90 % interval of the pooled :func:`overhead` with the rounds resampled (seed 0): a round's two runs
    and all their steps come along together, since steps of one run share that run's machine load."""
    rng = random.Random(0)
    rounds = list(zip(unset, alone))
    vals = []
    for _ in range(BOOTSTRAP_ROUNDS):
        pick = rng.choices(rounds, k=len(rounds))
        vals.append(overhead(pooled([u for u, _ in pick]), pooled([a for _, a in pick]), moved_s))
    vals.sort()
    return vals[int(0.05 * BOOTSTRAP_ROUNDS)], vals[int(0.95 * BOOTSTRAP_ROUNDS) - 1]


def pooled(runs: Sequence[Run]) -> list[float]:
    return [s for r in runs for s in r.steps_s]


def spread(values: Sequence[float]) -> str:
    """``median [p25-p75] min-max, n`` of step times in seconds."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:.3f} [{q[0]:.3f}-{q[2]:.3f}] {min(values):.3f}-{max(values):.3f}, n={len(values)}"


def state_bytes(model_dir: Path) -> int:
    """Bytes of the trainer state one offload moves: fp32 parameters (read off the model file) x copies."""
    from safetensors import safe_open

    numel = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            numel += n
    return numel * 4 * STATE_COPIES


def state_cache_times(model_dir: Path, repeats: int) -> tuple[float, float, int]:
    """Median StateCache offload and reload seconds (whole calls) and bytes for the job's trainer state:
    the model's fp32 parameters, their gradients and AdamW's two moments after one step.

    One intra-op thread, as the harness's workers run (``OMP_NUM_THREADS=1``): with torch's default pool
    each of the cache's ~140 small copies waits for a second thread, on a loaded 2-core box about 1 ms
    each (64-300 ms per call, where one thread takes about 5 ms)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollmux.sidecar.state_cache import StateCache

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for p in model.parameters():  # own the storages (the loader maps the file), as a trained model does
        p.data = p.data.clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    cache = StateCache("verl-bench")
    cache.register_module("actor", model)
    cache.register_optimizer("adamw", opt)
    off, on = [], []
    for _ in range(repeats):
        off.append(cache.offload())
        on.append(cache.reload())
    cache.release()
    return (statistics.median(c.total_s for c in off), statistics.median(c.total_s for c in on), off[0].nbytes)


def collect(fin: Any, job_mod: Any, events: list[dict[str, Any]], cpu: tuple[float, float]) -> Run:
    """A Run from a finished harness job, the adapter records of the run it was in and the machine's
    (busy, steal) CPUs during it."""
    log = fin.job.workdir / "job.log"
    if fin.rc != 0:
        print(f"  {fin.job.name}: exit {fin.rc}, see {log}", flush=True)
        return Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s)
    mine = [r for r in events if r.get("kind") == "adapter" and r.get("job") == fin.job.name]
    metrics = job_mod.step_metrics(log)
    steps = max(len(metrics), 1)
    moved = {e: sum(r["seconds"] for r in mine if r.get("event") == e) / steps for e in ("offload", "reload")}
    bounds = [r for r in mine if r.get("event") == "boundary"]
    gates = tuple((p, statistics.fmean(r["acquire_s"] for r in b), statistics.fmean(r["release_s"] for r in b))
                  for p in ("rollout", "train", "sync") if (b := [r for r in bounds if r["phase"] == p]))
    timings = measured_timings(metrics)
    run = Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s, steps_s=timings["step"],
              timings=tuple(timings.items()), offload_s=moved["offload"], reload_s=moved["reload"], gates=gates,
              permit_s=sum(r["acquire_s"] + r["release_s"] for r in bounds) / steps, busy_cores=cpu[0],
              steal_cores=cpu[1])
    gate_ms = ", ".join(f"{p} {a * 1e3:.1f}+{r * 1e3:.1f}" for p, a, r in gates)
    print(f"  {run.name}: rc 0, wall {run.wall_s:.1f} s, steps {' '.join(f'{s:.3f}' for s in run.steps_s)} s "
          f"(median {run.step_s:.3f}), offload {run.offload_s * 1e3:.1f} ms, reload {run.reload_s * 1e3:.1f} ms, "
          f"gates {run.permit_s * 1e3:.1f} ms per step{' (acquire+release ms: ' + gate_ms + ')' if gates else ''}; "
          f"machine busy {run.busy_cores:.2f} CPUs (steal {run.steal_cores:.2f})", flush=True)
    return run


def busy(spans: list[Any], report: Any, jobs: set[str]) -> dict[str, float]:
    """Busy fraction per pool while every one of `jobs` ran (from the phase records)."""
    mine = [s for s in spans if s.job in jobs]
    window = report.steady_window(mine) if len(jobs) > 1 else (min(s.start for s in mine), max(s.end for s in mine))
    return {pool: report.busy_fraction(mine, pool, window) for pool in ("rollout", "train")}


def row(what: str, measured: float, baseline: float | None, unit: str, target: str = "") -> str:
    base = f"{baseline:>12.3f}" if baseline is not None else f"{'-':>12}"
    ratio = f"{measured / baseline:>9.3f}" if baseline else f"{'-':>9}"
    return f"{what:<44}{measured:>12.3f}{base}{ratio}  {unit:<6}{target}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="training steps per job (default 4; the first is warm-up)")
    ap.add_argument("--pairs", type=int, default=5, help="rounds of job A unset and opted in alone (default 5)")
    ap.add_argument("--out", default=None, help="folder for job logs and phase records (default: a temp dir)")
    ap.add_argument("--gantt", action="store_true", help="also draw OUT/gantt.png of the multiplexed run")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed or a job failed")
    ap.add_argument("--cache-repeats", type=int, default=21, help="StateCache offload/reload rounds (median)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.pairs < 1:
        ap.error("--steps and --pairs must be >= 1")
    assets, job_mod, scenario = _harness()
    from rollmux.demo import report

    if not scenario.redis_available():
        raise SystemExit("redis-server is missing: run bash scripts/setup.sh --dev")
    out = Path(args.out or tempfile.mkdtemp(prefix="rollmux-verl-bench-"))
    model = assets.build(out / "assets")
    print(f"records and logs: {out}", flush=True)

    def job(name: str, tag: str, seed: int) -> Any:
        return job_mod.VerlJob(name=name, assets=model, workdir=out / tag / name, steps=args.steps, seed=seed,
                               response_length=8 if seed == 0 else 12)

    made: list[Any] = []
    invocations = iter(range(1, 2 * args.pairs + 3))

    def go(label: str, pairs: list[tuple[Any, dict[str, str] | None]], events: Path | None) -> list[Run]:
        print(f"{next(invocations)}/{2 * args.pairs + 2} {label} ...", flush=True)
        made.extend(j for j, _ in pairs)
        t0 = cpu_ticks()
        done = scenario.run(pairs)
        t1 = cpu_ticks()
        span = max(t1[2] - t0[2], 1) / (os.cpu_count() or 1)  # jiffies of one CPU over the run
        cpu = ((t1[0] - t0[0]) / span, (t1[1] - t0[1]) / span)
        ev = job_mod.read_jsonl(events) if events else []
        return [collect(done[j.name], job_mod, ev, cpu) for j, _ in pairs]

    unset: list[Run] = []
    alone: list[Run] = []
    try:
        with scenario.rollmux_setup(out / "rollmux") as cluster:
            for i in range(1, args.pairs + 1):
                for opted in ((False, True) if i % 2 else (True, False)):
                    if opted:
                        name = f"a-alone-{i}"
                        alone += go(f"job A opted in alone (round {i})",
                                    [(job(name, "alone", 0), scenario.opt_in(cluster, name))], cluster.events)
                    else:
                        unset += go(f"job A, not opted in (round {i})", [(job(f"a-unset-{i}", "unset", 0), None)],
                                    None)
            (solo_b,) = go("job B, not opted in", [(job("b-unset", "unset", 1), None)], None)
            pair = [job("a-mux", "mux", 0), job("b-mux", "mux", 1)]
            mux_a, mux_b = go("jobs A and B multiplexed", [(j, scenario.opt_in(cluster, j.name)) for j in pair],
                              cluster.events)
            records = job_mod.read_jsonl(cluster.events)
    finally:
        for j in made:
            shutil.rmtree(j.ray_tmp(), ignore_errors=True)
    runs = [*unset, *alone, solo_b, mux_a, mux_b]
    if any(r.rc for r in runs):
        print("a job failed; no figures", file=sys.stderr)
        return 1
    return report_all(args, out, model, records, report, unset, alone, [solo_b, mux_a, mux_b])


def report_overhead(unset: list[Run], alone: list[Run]) -> tuple[float, float, float]:
    """Print the opted-in-alone rows; returns (overhead, offload s, reload s) per step."""
    base_steps, in_steps = pooled(unset), pooled(alone)
    base, opted = statistics.median(base_steps), statistics.median(in_steps)
    off, on = statistics.fmean(r.offload_s for r in alone), statistics.fmean(r.reload_s for r in alone)
    moved = off + on
    ovh = overhead(base_steps, in_steps, moved)
    lo, hi = bootstrap(unset, alone, moved)
    print(row("A opted in alone: median step (vs A unset)", opted, base, "s"))
    print(row("  step - offload - reload (vs A unset)", opted - moved, base, "s",
              f"overhead {ovh:+.1%} (<= {TARGET_OVERHEAD:.0%})"))
    permit = statistics.fmean(r.permit_s for r in alone)
    print(row("  of which phase gates (permit path)", permit, base, "s", "acquire+release, nodes free"))
    print(f"  spread: unset steps {spread(base_steps)}; opted-in steps {spread(in_steps)} (s: median "
          f"[p25-p75] min-max)")
    rounds = [overhead(u.steps_s, a.steps_s, a.moved_s) for u, a in zip(unset, alone)]
    print(f"  overhead per round (its two runs' medians): {', '.join(f'{o:+.1%}' for o in rounds)}; "
          f"90% bootstrap interval of the pooled figure (rounds resampled) {lo:+.1%} .. {hi:+.1%}")
    print("  machine busy per round, unset / opted in (CPUs, this job included): " + ", ".join(
        f"{u.busy_cores:.2f}/{a.busy_cores:.2f}" for u, a in zip(unset, alone)))

    def med(runs: list[Run]) -> dict[str, float]:
        keys = set.intersection(*(set(dict(r.timings)) for r in runs))
        return {k: statistics.median(v for r in runs for v in dict(r.timings)[k]) for k in keys}

    mb, mi = med(unset), med(alone)
    print("  veRL timing_s median deltas, opted in alone - unset (ms): " + ", ".join(
        f"{k} {(mi[k] - mb[k]) * 1e3:+.0f}" for k in sorted(mi) if k in mb and k != "step"))
    return ovh, off, on


def report_all(args: argparse.Namespace, out: Path, model: Path, records: list[dict[str, Any]], report: Any,
               unset: list[Run], alone: list[Run], rest: list[Run]) -> int:
    """Print the table and write OUT/verl_cpu.json; returns the exit status."""
    solo_b, mux_a, mux_b = rest
    spans = report.spans(records)
    mux_spans = [s for s in spans if s.job in {"a-mux", "b-mux"}]
    bad = len(report.overlaps(spans)) + len(report.order_violations(spans))
    base = statistics.median(pooled(unset))
    print(f"\n{f'veRL 0.9.1 GRPO, CPU harness, {args.pairs} rounds x {args.steps} steps':<44}{'measured':>12}"
          f"{'baseline':>12}{'ratio':>9}  unit  target")
    ovh, off, on = report_overhead(unset, alone)
    nbytes = state_bytes(model)
    gbps = {e: (nbytes / s / 1e9 if s > 0 else float("nan")) for e, s in (("offload", off), ("reload", on))}
    print(row("  offload per step", off, None, "s", f"{gbps['offload']:.3f} GB/s"))
    print(row("  reload per step", on, None, "s", f"{gbps['reload']:.3f} GB/s"))
    cache_off, cache_on, cache_bytes = state_cache_times(model, args.cache_repeats)
    print(row("  StateCache offload, same state (vs to cpu)", cache_off, off, "s",
              f"{cache_bytes / cache_off / 1e9:.3f} GB/s, in-process"))
    print(row("  StateCache reload, same state (vs to device)", cache_on, on, "s",
              f"{cache_bytes / cache_on / 1e9:.3f} GB/s, in-process"))
    a_wall = statistics.median(r.wall_s for r in unset)
    sequential, muxed = a_wall + solo_b.wall_s, max(mux_a.wall_s, mux_b.wall_s)
    first = alone[0].name
    b_alone, b_mux = busy(spans, report, {first}), busy(mux_spans, report, {"a-mux", "b-mux"})
    print(row("A+B makespan: multiplexed (vs sequential)", muxed, sequential, "s", f"< {TARGET_MAKESPAN:g}x"))
    print(row("  A step multiplexed (vs A unset)", mux_a.step_s, base, "s", "slowdown"))
    print(row("  B step multiplexed (vs B unset)", mux_b.step_s, solo_b.step_s, "s", "slowdown"))
    for pool in ("rollout", "train"):
        print(row(f"  {pool} pool busy: A+B (vs A alone)", b_mux[pool], b_alone[pool], "frac"))
    print(f"\nsequential = median wall of A unset ({', '.join(f'{r.wall_s:.1f}' for r in unset)} s) + B unset; "
          f"A alone's busy fraction is {first}'s.")
    print(f"state bytes per offload {nbytes} (fp32 params x {STATE_COPIES}, from the model file); on CPU the "
          f"state is already in host memory, so GB/s is the RPC cost, not a copy rate.")
    print(f"phase records: {len(spans)} owned phases, overlaps + order violations {bad}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    (out / "verl_cpu.json").write_text(json.dumps(
        {"steps": args.steps, "pairs": args.pairs, "runs": [asdict(r) for r in [*unset, *alone, *rest]],
         "overhead": ovh, "state_bytes": nbytes, "gbps": gbps, "makespan": {"sequential": sequential,
         "multiplexed": muxed}, "busy": {"mux": b_mux, "alone": b_alone}, "violations": bad,
         "state_cache": {"offload_s": cache_off, "reload_s": cache_on, "bytes": cache_bytes}}, indent=2, default=str))
    if args.gantt:
        print("gantt:", report.gantt([r for r in records if r.get("job") in {"a-mux", "b-mux"}], out / "gantt.png",
                                     title="veRL A + B multiplexed (CPU harness)"))
    ok = ovh <= TARGET_OVERHEAD and muxed / sequential < TARGET_MAKESPAN and bad == 0
    print("targets met" if ok else "target missed")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
