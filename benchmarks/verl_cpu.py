"""Real veRL 0.9.1 GRPO jobs on the CPU harness: opted in to RollMux vs not, and two jobs multiplexed
vs run one after the other.

    flock /tmp/rollmux-heavy.lock .venv/bin/python benchmarks/verl_cpu.py [--steps 2] [--check]

Needs a source checkout (the harness lives in tests/adapters/verl/harness/) and
``bash scripts/setup.sh --dev`` (veRL 0.9.1, redis-server). Four runs, one after the other:

1. job A, not opted in (the variable unset): the baseline step time;
2. job B, not opted in: with run 1 the *sequential* baseline (makespan = wall A + wall B);
3. job A opted in alone against a real coordinator (Redis) and one sidecar per pool: per-step overhead
   = (opted-in step - offload - reload - unset step) / unset step, target <= 3 %. The offload/reload
   (veRL's worker ``to("cpu")`` / ``to("device")`` between sync and the next train phase) is reported
   on its own, with GB/s = state bytes / measured seconds. The seconds are the adapter's own
   measurements (its ``offload``/``reload`` records); the bytes are derived from the model file
   (fp32 parameters, gradients and two Adam moments), not counted inside the worker. On this CPU box
   the state already lives in host memory, so that figure is the cost of the RPC, not a copy rate.
   Beside it, RollMux's ``StateCache`` offloads and reloads the same state (the model file loaded with
   transformers, gradients and AdamW moments after one step) in this process: the other path the
   adapter could take, timed on the same bytes (median of ``--cache-repeats``);
4. jobs A and B multiplexed (started together, both opted in): makespan ratio (target < 1), per-job
   slowdown (multiplexed step / unset step) and the busy fraction of each pool from the phase
   records, next to the busy fraction of job A alone (run 3).

Step times are veRL's own ``timing_s/step``, averaged over the steps after the first (warm-up; with
``--steps 1`` the only step is used). Everything comes from this one invocation; wall-clock figures
depend on the machine's load (printed at the end). ``--check`` exits 1 when a target is missed or a
job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "adapters" / "verl" / "harness"
TARGET_OVERHEAD, TARGET_MAKESPAN = 0.03, 1.0
STATE_COPIES = 4  # parameters, gradients, Adam exp_avg and exp_avg_sq (fp32 each)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One finished job: veRL's step times and what the adapter recorded for it."""

    name: str
    rc: int
    wall_s: float
    step_s: float  # mean timing_s/step over the measured steps
    offload_s: float = 0.0  # mean adapter-measured offload per step
    reload_s: float = 0.0  # mean adapter-measured reload per step
    permit_s: float = 0.0  # mean time per step in the phase gates (acquire + release, adapter-measured)
    gates: tuple[tuple[str, float, float], ...] = ()  # (phase, mean acquire s, mean release s) per phase
    timings: tuple[tuple[str, float], ...] = ()  # veRL's timing_s/* means over the measured steps


def _harness() -> tuple[Any, Any, Any]:
    if not (HARNESS / "scenario.py").exists():
        raise SystemExit(f"benchmarks/verl_cpu.py needs a source checkout: {HARNESS} is missing")
    sys.path.insert(0, str(HARNESS))
    import assets
    import job
    import scenario

    return assets, job, scenario


def mean_timings(step_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
    """Mean of each ``timing_s/*`` over the steps after the first (the only one if there is one)."""
    steps = sorted(step_metrics)
    if not steps:
        raise SystemExit("veRL printed no step metrics: see the job.log named above")
    used = [step_metrics[s] for s in steps[1:] or steps]
    keys = [k for k in used[0] if k.startswith("timing_s/") and all(k in m for m in used)]
    return {k.removeprefix("timing_s/"): statistics.fmean(m[k] for m in used) for k in keys}


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
    the model's fp32 parameters, their gradients and AdamW's two moments after one step."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollmux.sidecar.state_cache import StateCache

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
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


def collect(fin: Any, job_mod: Any, events: list[dict[str, Any]]) -> Run:
    """A Run from a finished harness job and the adapter records of the run it was in."""
    log = fin.job.workdir / "job.log"
    if fin.rc != 0:
        print(f"  {fin.job.name}: exit {fin.rc}, see {log}", flush=True)
        return Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s, step_s=float("nan"))
    mine = [r for r in events if r.get("kind") == "adapter" and r.get("job") == fin.job.name]
    steps = max(len(job_mod.step_metrics(log)), 1)
    moved = {e: sum(r["seconds"] for r in mine if r.get("event") == e) / steps for e in ("offload", "reload")}
    bounds = [r for r in mine if r.get("event") == "boundary"]
    gates = tuple((p, statistics.fmean(r["acquire_s"] for r in b), statistics.fmean(r["release_s"] for r in b))
                  for p in ("rollout", "train", "sync") if (b := [r for r in bounds if r["phase"] == p]))
    timings = mean_timings(job_mod.step_metrics(log))
    run = Run(name=fin.job.name, rc=fin.rc, wall_s=fin.wall_s, step_s=timings["step"],
              timings=tuple(timings.items()), offload_s=moved["offload"], reload_s=moved["reload"], gates=gates,
              permit_s=sum(r["acquire_s"] + r["release_s"] for r in bounds) / steps)
    gate_ms = ", ".join(f"{p} {a * 1e3:.1f}+{r * 1e3:.1f}" for p, a, r in gates)
    print(f"  {run.name}: rc 0, wall {run.wall_s:.1f} s, step {run.step_s:.3f} s, offload "
          f"{run.offload_s * 1e3:.1f} ms, reload {run.reload_s * 1e3:.1f} ms, gates {run.permit_s * 1e3:.1f} ms "
          f"per step{' (acquire+release ms: ' + gate_ms + ')' if gates else ''}", flush=True)
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
    ap.add_argument("--steps", type=int, default=2, help="training steps per job (default 2; the first is warm-up)")
    ap.add_argument("--out", default=None, help="folder for job logs and phase records (default: a temp dir)")
    ap.add_argument("--gantt", action="store_true", help="also draw OUT/gantt.png of the multiplexed run")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed or a job failed")
    ap.add_argument("--cache-repeats", type=int, default=21, help="StateCache offload/reload rounds (median)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
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

    def go(label: str, pairs: list[tuple[Any, dict[str, str] | None]], events: Path | None) -> list[Run]:
        print(f"{label} ...", flush=True)
        made.extend(j for j, _ in pairs)
        done = scenario.run(pairs)
        ev = job_mod.read_jsonl(events) if events else []
        return [collect(done[j.name], job_mod, ev) for j, _ in pairs]

    try:
        (solo_a,) = go("1/4 job A, not opted in", [(job("a-unset", "unset", 0), None)], None)
        (solo_b,) = go("2/4 job B, not opted in", [(job("b-unset", "unset", 1), None)], None)
        with scenario.rollmux_setup(out / "rollmux") as cluster:
            (alone,) = go("3/4 job A opted in alone", [(job("a-alone", "alone", 0),
                                                         scenario.opt_in(cluster, "a-alone"))], cluster.events)
            pair = [job("a-mux", "mux", 0), job("b-mux", "mux", 1)]
            mux_a, mux_b = go("4/4 jobs A and B multiplexed", [(j, scenario.opt_in(cluster, j.name)) for j in pair],
                              cluster.events)
            records = job_mod.read_jsonl(cluster.events)
    finally:
        for j in made:
            shutil.rmtree(j.ray_tmp(), ignore_errors=True)
    runs = [solo_a, solo_b, alone, mux_a, mux_b]
    if any(r.rc for r in runs):
        print("a job failed; no figures", file=sys.stderr)
        return 1
    return report_all(args, out, model, records, report, runs)


def report_all(args: argparse.Namespace, out: Path, model: Path, records: list[dict[str, Any]], report: Any,
               runs: list[Run]) -> int:
    """Print the table and write OUT/verl_cpu.json; returns the exit status."""
    solo_a, solo_b, alone, mux_a, mux_b = runs
    spans = report.spans(records)
    mux_spans = [s for s in spans if s.job in {"a-mux", "b-mux"}]
    bad = len(report.overlaps(spans)) + len(report.order_violations(spans))
    moved = alone.offload_s + alone.reload_s
    overhead = (alone.step_s - moved - solo_a.step_s) / solo_a.step_s
    nbytes = state_bytes(model)
    gbps = {e: (nbytes / s / 1e9 if s > 0 else float("nan")) for e, s in (("offload", alone.offload_s),
                                                                          ("reload", alone.reload_s))}
    sequential, muxed = solo_a.wall_s + solo_b.wall_s, max(mux_a.wall_s, mux_b.wall_s)
    b_alone, b_mux = busy(spans, report, {"a-alone"}), busy(mux_spans, report, {"a-mux", "b-mux"})
    print(f"\n{'veRL 0.9.1 GRPO, CPU harness, steps=' + str(args.steps):<44}{'measured':>12}{'baseline':>12}"
          f"{'ratio':>9}  unit  target")
    print(row("A opted in alone: step (vs A unset)", alone.step_s, solo_a.step_s, "s"))
    print(row("  step - offload - reload (vs A unset)", alone.step_s - moved, solo_a.step_s, "s",
              f"overhead {overhead:+.1%} (<= {TARGET_OVERHEAD:.0%})"))
    print(row("  of which phase gates (permit path)", alone.permit_s, solo_a.step_s, "s",
              "acquire+release, nodes free"))
    base = dict(solo_a.timings)
    print("  veRL timing_s deltas, opted in alone - unset (ms): " + ", ".join(
        f"{k} {(v - base[k]) * 1e3:+.0f}" for k, v in alone.timings if k in base and k != "step"))
    print(row("  offload per step", alone.offload_s, None, "s", f"{gbps['offload']:.3f} GB/s"))
    print(row("  reload per step", alone.reload_s, None, "s", f"{gbps['reload']:.3f} GB/s"))
    cache_off, cache_on, cache_bytes = state_cache_times(model, args.cache_repeats)
    print(row("  StateCache offload, same state (vs to cpu)", cache_off, alone.offload_s, "s",
              f"{cache_bytes / cache_off / 1e9:.3f} GB/s, in-process"))
    print(row("  StateCache reload, same state (vs to device)", cache_on, alone.reload_s, "s",
              f"{cache_bytes / cache_on / 1e9:.3f} GB/s, in-process"))
    print(row("A+B makespan: multiplexed (vs sequential)", muxed, sequential, "s", f"< {TARGET_MAKESPAN:g}x"))
    print(row("  A step multiplexed (vs A unset)", mux_a.step_s, solo_a.step_s, "s", "slowdown"))
    print(row("  B step multiplexed (vs B unset)", mux_b.step_s, solo_b.step_s, "s", "slowdown"))
    for pool in ("rollout", "train"):
        print(row(f"  {pool} pool busy: A+B (vs A alone)", b_mux[pool], b_alone[pool], "frac"))
    print(f"\nstate bytes per offload {nbytes} (fp32 params x {STATE_COPIES}, from the model file); on CPU the "
          f"state is already in host memory, so GB/s is the RPC cost, not a copy rate.")
    print(f"phase records: {len(spans)} owned phases, overlaps + order violations {bad}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    (out / "verl_cpu.json").write_text(json.dumps(
        {"steps": args.steps, "runs": [asdict(r) for r in runs],
         "overhead": overhead, "state_bytes": nbytes, "gbps": gbps, "makespan": {"sequential": sequential,
         "multiplexed": muxed}, "busy": {"mux": b_mux, "alone": b_alone}, "violations": bad,
         "state_cache": {"offload_s": cache_off, "reload_s": cache_on, "bytes": cache_bytes}}, indent=2, default=str))
    if args.gantt:
        print("gantt:", report.gantt([r for r in records if r.get("job") in {"a-mux", "b-mux"}], out / "gantt.png",
                                     title="veRL A + B multiplexed (CPU harness)"))
    ok = overhead <= TARGET_OVERHEAD and muxed / sequential < TARGET_MAKESPAN and bad == 0
    print("targets met" if ok else "target missed")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
