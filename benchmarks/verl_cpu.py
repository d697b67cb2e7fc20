"""Real veRL 0.9.1 GRPO jobs on the CPU harness: opted in to RollMux vs not, and two jobs multiplexed
vs run one after the other.

    flock /tmp/rollmux-heavy.lock .venv/bin/python benchmarks/verl_cpu.py [--pair-steps 61] [--steps 4] [--check]

Needs a source checkout (the harness lives in tests/adapters/verl/harness/) and
``bash scripts/setup.sh --dev`` (veRL 0.9.1, redis-server). One RollMux setup (Redis, the coordinator,
one sidecar per pool) runs for the whole invocation. The runs, one after the other (about 10 minutes
with the defaults):

1. job A not opted in (the variable unset) and job A opted in alone, ``--pair-steps`` steps each, built
   at once (each its own Ray instance) and then run *one step at a time in turn* (``_paired.alternate``):
   each trainer waits at ``fit()`` and after every step (the harness's step gate, ``RMX_STEP_GATE``: it
   holds the driver after veRL has logged a step, outside veRL's ``timing_s/step``, the same in both
   jobs) and the benchmark lets one step of one job run at a time, the unset job first in even steps
   and the opted-in one first in odd ones, so the two steps of a pair see the same machine load. Once
   built and again before every step, both jobs' processes are reniced to 0 (Ray starts its workers at
   15; a first run found the opted-in job's agent-loop workers, started as its trainer reached
   ``fit()``, still at 15 after the renice at build time). Per pair (step k of each, veRL's own
   ``timing_s/step``): (opted-in step - its offload/reload - unset step) / unset step,
   the opted-in step's extra time besides offload/reload; the overhead is the median over the pairs
   (target <= 3 %, what ``--check`` reads), printed with the spread of the pair values and a
   distribution-free interval of the median (order statistics, coverage >= 90 %). Rule: step 1 of both
   jobs is left out (warm-up); every later pair is kept. Also printed: the same with offload/reload
   left in, the phase gates' time per step and veRL's per-phase timing deltas (medians).
   A step is about 2.2 s, 2.0 s of it veRL's ``ReplayBuffer`` poll sleep (the rollouts finish within
   the first poll). ``--poll-s`` shortens that poll in both jobs (harness ``RMX_REPLAY_POLL_S``): the
   steps get shorter, but the adapter's fixed cost per step (permit round trips, RPCs) then weighs more
   in the ratio, and the noise of the work besides the sleep stays: the default keeps veRL's 2.0 s.
   The offload/reload (veRL's worker ``to("cpu")`` / ``to("device")`` between sync and the next train
   phase) is reported on its own, with GB/s = state bytes / measured seconds. The seconds are the
   adapter's own measurements (its ``offload``/``reload`` records, assigned to a step by their time);
   the bytes are derived from the model file (fp32 parameters, gradients and two Adam moments), not
   counted inside the worker. On this CPU box the state already lives in host memory, so that figure
   is the cost of the RPC, not a copy rate. Beside it, RollMux's ``StateCache`` offloads and reloads the
   same state (the model file loaded with transformers, gradients and AdamW moments after one step) in
   this process, on one thread as the job's workers run: the other path the adapter could take, timed
   on the same bytes (median of ``--cache-repeats``; it leaves out the RPC into veRL's worker that the
   adapter would need to run it); ``benchmarks/verl_offload.py`` compares both paths on an
   FSDP2-sharded state, on a GPU where one is;
2. job A then job B, not opted in, ``--steps`` steps each, ungated: the *sequential* baseline (makespan
   = wall of A + wall of B);
3. jobs A and B multiplexed (started together, both opted in): makespan ratio (target < 1), per-job
   slowdown (median multiplexed step / median unset step of part 2) and the busy fraction of each pool
   from the phase records, next to the busy fraction of job A opted in alone (part 1, over its steps).

Step times are veRL's own ``timing_s/step`` of the steps after the first (warm-up; with ``--steps 1``
the only step is used). Everything comes from this one invocation; wall-clock figures depend on the
machine's load (the busy CPUs of each part and the load average are printed). ``--check`` exits 1 when
a target is missed or a job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "adapters" / "verl" / "harness"
sys.path.insert(0, str(ROOT / "benchmarks"))
from _paired import PairStats, alternate, pct, renice  # noqa: E402

TARGET_OVERHEAD, TARGET_MAKESPAN = 0.03, 1.0
STATE_COPIES = 4  # parameters, gradients, Adam exp_avg and exp_avg_sq (fp32 each)
WAIT_S = 900.0  # longest wait for a build, a step or a job's end


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One finished job: veRL's step times and what the adapter recorded for it."""

    name: str
    rc: int
    wall_s: float
    steps_s: tuple[float, ...] = ()  # timing_s/step of each measured step (after the warm-up)
    moved_steps_s: tuple[float, ...] = ()  # adapter-measured offload + reload in each measured step (gated runs)
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

    from rollmux.shim.state_cache import StateCache

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


def in_windows(records: list[dict[str, Any]], windows: Sequence[tuple[float, float]],
               value: Callable[[dict[str, Any]], float]) -> list[float]:
    """Per window (wall-clock start, end), the sum of `value` over the records whose time ``t`` falls in it."""
    return [sum(value(r) for r in records if lo <= r["t"] <= hi) for lo, hi in windows]


def collect(fin: Any, job_mod: Any, events: list[dict[str, Any]], cpu: tuple[float, float],
            windows: Sequence[tuple[float, float]] | None = None) -> Run:
    """A Run from a finished harness job, the adapter records of the run it was in and the machine's
    (busy, steal) CPUs during it. With `windows` (wall-clock start and end of each measured step of a
    gated run), the adapter's figures are those of the measured steps, and per step."""
    log = fin.job.workdir / "job.log"
    if fin.rc != 0:
        print(f"  {fin.job.name}: exit {fin.rc}, see {log}", flush=True)
        return Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s)
    mine = [r for r in events if r.get("kind") == "adapter" and r.get("job") == fin.job.name]
    metrics = job_mod.step_metrics(log)
    steps = max(len(metrics), 1)
    if windows is not None:
        mine = [r for r in mine if any(lo <= r["t"] <= hi for lo, hi in windows)]
        steps = max(len(windows), 1)
    moved = {e: sum(r["seconds"] for r in mine if r.get("event") == e) / steps for e in ("offload", "reload")}
    per_step = in_windows([r for r in mine if r.get("event") in ("offload", "reload")], windows or (),
                          lambda r: r["seconds"])
    bounds = [r for r in mine if r.get("event") == "boundary"]
    gates = tuple((p, statistics.fmean(r["acquire_s"] for r in b), statistics.fmean(r["release_s"] for r in b))
                  for p in ("rollout", "train", "sync") if (b := [r for r in bounds if r["phase"] == p]))
    timings = measured_timings(metrics)
    run = Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s, steps_s=timings["step"], moved_steps_s=tuple(per_step),
              timings=tuple(timings.items()), offload_s=moved["offload"], reload_s=moved["reload"], gates=gates,
              permit_s=sum(r["acquire_s"] + r["release_s"] for r in bounds) / steps, busy_cores=cpu[0],
              steal_cores=cpu[1])
    gate_ms = ", ".join(f"{p} {a * 1e3:.1f}+{r * 1e3:.1f}" for p, a, r in gates)
    print(f"  {run.name}: rc 0, wall {run.wall_s:.1f} s, {len(run.steps_s)} measured steps (median {run.step_s:.3f} s), "
          f"offload {run.offload_s * 1e3:.1f} ms, reload {run.reload_s * 1e3:.1f} ms, "
          f"gates {run.permit_s * 1e3:.1f} ms per step{' (acquire+release ms: ' + gate_ms + ')' if gates else ''}; "
          f"machine busy {run.busy_cores:.2f} CPUs (steal {run.steal_cores:.2f})", flush=True)
    return run


def busy(spans: list[Any], report: Any, jobs: set[str],
         windows: Sequence[tuple[float, float]] | None = None) -> dict[str, float]:
    """Busy fraction per pool while every one of `jobs` ran (from the phase records); with `windows`, over
    those windows together (a gated job's steps, leaving out its pauses)."""
    mine = [s for s in spans if s.job in jobs]
    if windows:
        total = sum(hi - lo for lo, hi in windows)
        return {pool: sum(report.busy_fraction(mine, pool, w) * (w[1] - w[0]) for w in windows) / total
                for pool in ("rollout", "train")}
    window = report.steady_window(mine) if len(jobs) > 1 else (min(s.start for s in mine), max(s.end for s in mine))
    return {pool: report.busy_fraction(mine, pool, window) for pool in ("rollout", "train")}


def row(what: str, measured: float, baseline: float | None, unit: str, target: str = "") -> str:
    base = f"{baseline:>12.3f}" if baseline is not None else f"{'-':>12}"
    ratio = f"{measured / baseline:>9.3f}" if baseline else f"{'-':>9}"
    return f"{what:<44}{measured:>12.3f}{base}{ratio}  {unit:<6}{target}"


def busy_cpus(t0: tuple[int, int, int], t1: tuple[int, int, int]) -> tuple[float, float]:
    """(busy, steal) CPUs of the machine between two :func:`cpu_ticks` readings."""
    span = max(t1[2] - t0[2], 1) / (os.cpu_count() or 1)  # jiffies of one CPU over the span
    return (t1[0] - t0[0]) / span, (t1[1] - t0[1]) / span


def _wait_file(path: Path, proc: Any, name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"job {name} ended (rc {proc.poll()}) or stalled before {path}: see its job.log")
        time.sleep(0.01)


def run_paired(jobs: Sequence[tuple[Any, dict[str, str] | None]], scenario: Any, job_mod: Any,
               events: Path) -> tuple[list[Run], list[tuple[float, float]], tuple[int, int]]:
    """Build job A unset and opted in at once, then run them one step at a time in turn.

    Args:
        jobs: (unset job, None) and (opted-in job, its opt-in variables), in that order.

    Returns:
        Their Runs (measured steps: the second on), the opted-in job's measured step windows (wall-clock
        release to ``done``) and how many of their processes were reniced once built and later.
    """
    gate = {j.name: j.workdir / "steps" for j, _ in jobs}
    procs = {}
    for j, opt_in in jobs:
        gate[j.name].mkdir(parents=True, exist_ok=True)
        procs[j.name] = j.start({**(opt_in or {}), job_mod.START_FILE: str(gate[j.name] / "go-1"),
                                 job_mod.STEP_GATE: str(gate[j.name])})
    t_start = time.monotonic()
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(scenario.at_start_gate(j) for j, _ in jobs):
            if any(p.poll() is not None for p in procs.values()) or time.monotonic() > deadline:
                raise SystemExit(f"a paired job ended or stalled while building: see {[str(j.workdir) for j, _ in jobs]}")
            time.sleep(0.2)
        changed = [renice(pid for j, _ in jobs for pid in scenario.ray_pids(j))]
        print(f"  built in {time.monotonic() - t_start:.0f} s; {changed[0]} processes reniced to 0", flush=True)
        released: dict[tuple[str, int], float] = {}
        t0 = cpu_ticks()

        def release(j: Any, k: int) -> None:
            # again before every step, both jobs alike: Ray workers that start late (the agent loop's, as
            # the trainer reaches fit()) can miss the renice at build time and run at 15
            changed.append(renice(pid for j2, _ in jobs for pid in scenario.ray_pids(j2)))
            released[j.name, k] = time.time()
            (gate[j.name] / f"go-{k + 1}").touch()

        def finish(j: Any) -> Any:
            rc = procs[j.name].wait(timeout=WAIT_S)
            return scenario.Finished(job=j, rc=rc, wall_s=time.monotonic() - t_start)

        (unset, _), (opted, _) = jobs
        done = alternate(unset, opted, unset.steps, release=release, finish=finish,
                         wait_step=lambda j, k: _wait_file(gate[j.name] / f"done-{k + 1}", procs[j.name], j.name))
        cpu = busy_cpus(t0, cpu_ticks())
    finally:
        for (j, _), p in zip(jobs, procs.values()):
            if p.poll() is None:
                scenario.kill(j, p)
    ev = job_mod.read_jsonl(events)

    def windows(name: str) -> list[tuple[float, float]]:  # measured steps: the second on
        return [(released[name, k - 1], float((gate[name] / f"done-{k}").read_text())) for k in range(2, unset.steps + 1)]

    runs = [collect(done[j.name], job_mod, ev, cpu, windows(j.name)) for j, _ in jobs]
    return runs, windows(opted.name), (changed[0], sum(changed[1:]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair-steps", type=int, default=61, help="steps of job A unset and opted in, run in turn for "
                    "the overhead (default 61: 60 pairs after step 1)")
    ap.add_argument("--steps", type=int, default=4, help="steps per job, sequential vs multiplexed (default 4)")
    ap.add_argument("--poll-s", type=float, default=None, help="ReplayBuffer poll interval in every job (default: "
                    "veRL's, 2.0 s)")
    ap.add_argument("--out", default=None, help="folder for job logs and phase records (default: a temp dir)")
    ap.add_argument("--gantt", action="store_true", help="also draw OUT/gantt.png of the multiplexed run")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed or a job failed")
    ap.add_argument("--cache-repeats", type=int, default=21, help="StateCache offload/reload rounds (median)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.pair_steps < 2:
        ap.error("--steps must be >= 1 and --pair-steps >= 2")
    assets, job_mod, scenario = _harness()
    from rollmux.demo import report

    if not scenario.redis_available():
        raise SystemExit("redis-server is missing: run bash scripts/setup.sh --dev")
    out = Path(args.out or tempfile.mkdtemp(prefix="rollmux-verl-bench-"))
    model = assets.build(out / "assets")
    print(f"records and logs: {out}", flush=True)
    poll = {job_mod.REPLAY_POLL_S: str(args.poll_s)} if args.poll_s is not None else {}

    def job(name: str, tag: str, seed: int, steps: int | None = None) -> Any:
        return job_mod.VerlJob(name=name, assets=model, workdir=out / tag / name, steps=steps or args.steps, seed=seed,
                               response_length=8 if seed == 0 else 12, env=poll)

    made: list[Any] = []

    def go(label: str, pairs: list[tuple[Any, dict[str, str] | None]], events: Path | None) -> list[Run]:
        print(f"{label} ...", flush=True)
        made.extend(j for j, _ in pairs)
        t0 = cpu_ticks()
        done = scenario.run(pairs)
        cpu = busy_cpus(t0, cpu_ticks())
        ev = job_mod.read_jsonl(events) if events else []
        return [collect(done[j.name], job_mod, ev, cpu) for j, _ in pairs]

    try:
        with scenario.rollmux_setup(out / "rollmux") as cluster:
            paired = [job("a-unset-paired", "paired", 0, args.pair_steps), job("a-alone", "paired", 0, args.pair_steps)]
            made.extend(paired)
            print(f"1/4 job A unset and opted in alone, built at once, then {args.pair_steps} steps each one at a "
                  f"time in turn ...", flush=True)
            (unset, alone), windows, reniced = run_paired(
                [(paired[0], None), (paired[1], scenario.opt_in(cluster, paired[1].name))], scenario, job_mod,
                cluster.events)
            (solo_a,) = go("2/4 job A, not opted in", [(job("a-unset", "unset", 0), None)], None)
            (solo_b,) = go("3/4 job B, not opted in", [(job("b-unset", "unset", 1), None)], None)
            pair = [job("a-mux", "mux", 0), job("b-mux", "mux", 1)]
            mux_a, mux_b = go("4/4 jobs A and B multiplexed", [(j, scenario.opt_in(cluster, j.name)) for j in pair],
                              cluster.events)
            records = job_mod.read_jsonl(cluster.events)
    finally:
        for j in made:
            shutil.rmtree(j.ray_tmp(), ignore_errors=True)
    runs = [unset, alone, solo_a, solo_b, mux_a, mux_b]
    if any(r.rc for r in runs):
        print("a job failed; no figures", file=sys.stderr)
        return 1
    return report_all(args, out, model, records, report, runs, windows, reniced)


def report_overhead(unset: Run, alone: Run, reniced: tuple[int, int]) -> tuple[PairStats, float, float]:
    """Print the opted-in-alone rows from the pairs; returns (the pair statistics, offload s, reload s) per step."""
    if not (len(unset.steps_s) == len(alone.steps_s) == len(alone.moved_steps_s)):
        raise SystemExit(f"expected one measured step per pair, got {len(unset.steps_s)} unset, {len(alone.steps_s)} "
                         f"opted-in steps and {len(alone.moved_steps_s)} opted-in step windows")
    pairs = list(zip(unset.steps_s, alone.steps_s, alone.moved_steps_s))
    stats = PairStats.of([(o - m - u) / u for u, o, m in pairs])
    total = statistics.median(o / u - 1 for u, o, _ in pairs)
    base, opted, moved = unset.step_s, alone.step_s, statistics.median(alone.moved_steps_s)
    print(row("A opted in alone: median step (vs A unset)", opted, base, "s"))
    print(row("  step - offload - reload (vs A unset)", opted - moved, base, "s",
              f"overhead {pct(stats.median)} (<= {TARGET_OVERHEAD:.0%})"))
    print(row("  of which phase gates (permit path)", alone.permit_s, base, "s", "acquire+release, nodes free"))
    print(f"  overhead per step = median over {stats.n} pairs (steps 2-{stats.n + 1}, run in turn; step 1 left out by "
          f"rule) of (opted-in step - its offload/reload - unset step) / unset step: {pct(stats.median)}; "
          f"{pct(total)} with offload/reload")
    print(f"  {stats.spread_line()}")
    print(f"  machine busy during the pairs {unset.busy_cores:.2f} CPUs (steal {unset.steal_cores:.2f}; both jobs, "
          f"one step at a time); {reniced[0]} of their processes reniced to 0 once built, "
          f"{reniced[1]} more before later steps")
    mb, mi = dict(unset.timings), dict(alone.timings)
    print("  veRL timing_s median deltas, opted in alone - unset (ms): " + ", ".join(
        f"{k} {(statistics.median(mi[k]) - statistics.median(mb[k])) * 1e3:+.0f}" for k in sorted(mi)
        if k in mb and k != "step"))
    return stats, alone.offload_s, alone.reload_s


def report_all(args: argparse.Namespace, out: Path, model: Path, records: list[dict[str, Any]], report: Any,
               runs: list[Run], windows: list[tuple[float, float]], reniced: tuple[int, int]) -> int:
    """Print the table and write OUT/verl_cpu.json; returns the exit status."""
    unset, alone, solo_a, solo_b, mux_a, mux_b = runs
    spans = report.spans(records)
    mux_spans = [s for s in spans if s.job in {"a-mux", "b-mux"}]
    bad = len(report.overlaps(spans)) + len(report.order_violations(spans))
    poll = f"poll {args.poll_s:g} s" if args.poll_s is not None else "veRL's 2 s poll"
    print(f"\n{f'veRL 0.9.1 GRPO, CPU harness, {args.pair_steps} paired steps, {poll}':<44}{'measured':>12}"
          f"{'baseline':>12}{'ratio':>9}  unit  target")
    stats, off, on = report_overhead(unset, alone, reniced)
    nbytes = state_bytes(model)
    gbps = {e: (nbytes / s / 1e9 if s > 0 else float("nan")) for e, s in (("offload", off), ("reload", on))}
    print(row("  offload per step", off, None, "s", f"{gbps['offload']:.3f} GB/s"))
    print(row("  reload per step", on, None, "s", f"{gbps['reload']:.3f} GB/s"))
    cache_off, cache_on, cache_bytes = state_cache_times(model, args.cache_repeats)
    print(row("  StateCache offload, same state (vs to cpu)", cache_off, off, "s",
              f"{cache_bytes / cache_off / 1e9:.3f} GB/s, in-process"))
    print(row("  StateCache reload, same state (vs to device)", cache_on, on, "s",
              f"{cache_bytes / cache_on / 1e9:.3f} GB/s, in-process"))
    sequential, muxed = solo_a.wall_s + solo_b.wall_s, max(mux_a.wall_s, mux_b.wall_s)
    b_alone, b_mux = busy(spans, report, {alone.name}, windows), busy(mux_spans, report, {"a-mux", "b-mux"})
    print(row("A+B makespan: multiplexed (vs sequential)", muxed, sequential, "s", f"< {TARGET_MAKESPAN:g}x"))
    print(row("  A step multiplexed (vs A unset)", mux_a.step_s, solo_a.step_s, "s", "slowdown"))
    print(row("  B step multiplexed (vs B unset)", mux_b.step_s, solo_b.step_s, "s", "slowdown"))
    for pool in ("rollout", "train"):
        print(row(f"  {pool} pool busy: A+B (vs A alone)", b_mux[pool], b_alone[pool], "frac"))
    print(f"\nsequential = wall of A unset + B unset, {args.steps} steps each (machine busy {solo_a.busy_cores:.2f} / "
          f"{solo_b.busy_cores:.2f} CPUs; multiplexed {mux_a.busy_cores:.2f}); A alone's busy fraction is "
          f"{alone.name}'s over its measured steps.")
    print(f"state bytes per offload {nbytes} (fp32 params x {STATE_COPIES}, from the model file); on CPU the "
          f"state is already in host memory, so GB/s is the RPC cost, not a copy rate.")
    print(f"phase records: {len(spans)} owned phases, overlaps + order violations {bad}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    (out / "verl_cpu.json").write_text(json.dumps(
        {"steps": args.steps, "pair_steps": args.pair_steps, "poll_s": args.poll_s,
         "runs": [asdict(r) for r in runs], "overhead": asdict(stats), "state_bytes": nbytes, "gbps": gbps,
         "makespan": {"sequential": sequential, "multiplexed": muxed}, "busy": {"mux": b_mux, "alone": b_alone},
         "violations": bad, "state_cache": {"offload_s": cache_off, "reload_s": cache_on, "bytes": cache_bytes}},
        indent=2, default=str))
    if args.gantt:
        print("gantt:", report.gantt([r for r in records if r.get("job") in {"a-mux", "b-mux"}], out / "gantt.png",
                                     title="veRL A + B multiplexed (CPU harness)"))
    ok = stats.median <= TARGET_OVERHEAD and muxed / sequential < TARGET_MAKESPAN and bad == 0
    print("targets met" if ok else "target missed")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
