"""The real ROLL RLVR pipeline on CPU: RollMux's overhead on one job, and two jobs sequential vs multiplexed.

    python benchmarks/roll_cpu.py [--steps 4] [--out DIR] [--check]

Needs ``.venv-roll`` (``bash scripts/setup.sh --dev``) and a redis-server. Five real ROLL jobs (the
CPU harness of ``tests/adapters/roll``: tiny model, fsdp2_train on gloo, hf_infer, greedy) are built
at once, each waiting on its own start file, then run one scenario at a time so that no two
scenarios share the 2 cores:

1. ``u-a`` alone, variable unset (plain ROLL; actor_infer on actor_train's GPU, ROLL's default);
2. ``o-a`` alone, opted in, the same job (it registers co-located on the training pool; redis-server +
   coordinator + a rollout-node and a training-node sidecar, one set per scenario); 1 + 2 give the overhead;
3. ``d-a`` then ``d-b`` alone, opted in, disaggregated (actor_train on fake GPU 0, actor_infer on fake
   GPU 1: rollout on the rollout node, weights through the sync plugin; ``d-b`` another learning rate):
   the *sequential* baseline;
4. ``m-a`` and ``m-b``, the same two disaggregated jobs together, opted in (*multiplexed*: one job's
   rollout on the rollout node while the other trains on the training node).

Figures, each a ratio from this one run:

* overhead per step alone = wall time per step of ``o-a`` / ``u-a`` - 1, beside offload/reload
  (the seconds the driver spends in the clusters' ``offload_states`` / ``load_states``, which ROLL
  spends in both runs) reported separately, and the ratio with offload/reload taken out of both
  (target <= 3 %); with it the median step after the first (the driver's ``pipeline_step`` spans),
  the time the opted-in driver spent in permit calls (the adapter's own round trips), and the
  driver's time outside ROLL's phase spans and offload/reload, unset vs opted in (``outside_s``);
* makespan ratio = multiplexed makespan / sequential makespan (target < 1: multiplexing wins);
* per-job slowdown = a job's wall time multiplexed / alone;
* busy fraction per pool = time the pool's node held a permit / makespan (sequential and multiplexed).

No asserts by default; ``--check`` exits 1 below target. Wall-clock figures depend on machine load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "adapters" / "roll"))
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

from testbed import Job, Pools, build_assets, launch, phase_records, roll_unavailable, wait_built  # noqa: E402

from rollmux.adapters.roll.phases import SPAN_PHASES  # noqa: E402

TARGET_OVERHEAD, TARGET_MAKESPAN = 0.03, 1.0
LR = {"a": 1e-3, "b": 3e-3}


def _go(wd: Path, name: str) -> Path:
    return wd / f"go-{name}"


def _run(jobs: list[Job], go: Path, timeout_s: float) -> dict[str, dict[str, Any]]:
    go.touch()
    out = {j.name: j.wait(timeout_s=timeout_s) for j in jobs}
    bad = {n: r["log_tail"][-1500:] for n, r in out.items() if r["rc"] != 0}
    if bad:
        raise SystemExit(f"jobs failed: {bad}")
    return out


def offload_s(res: dict[str, Any]) -> float:
    """Seconds the driver spent in the clusters' ``offload_states`` / ``load_states`` in the run."""
    return float(sum(res["states_s"].values()))


def step_s(res: dict[str, Any]) -> list[float]:
    """Duration of each ``pipeline_step`` span, in step order."""
    return [end - start for name, start, end in res["spans"] if name == "pipeline_step"]


def outside_s(res: dict[str, Any]) -> list[float]:
    """Per step, the driver's seconds outside ROLL's phase spans and outside its offload/reload calls:
    what is left of a ``pipeline_step`` once ROLL's own work is taken out (CPU bookkeeping, and, opted in,
    the permit waits, which fall between the spans). Less noisy than whole steps, whose phases vary by
    a second from step to step on the shared box; it misses slow-downs the adapter might cause inside a
    phase (the wall-time ratio keeps those)."""
    phases = [(s, e) for name, s, e in res["spans"] if name in SPAN_PHASES]
    out = []
    for s, e in ((s, e) for name, s, e in res["spans"] if name == "pipeline_step"):
        inside = sum(e2 - s2 for s2, e2 in phases if s <= s2 and e2 <= e)
        moves = sum(c[3] - c[2] for c in res.get("state_calls") or [] if s <= c[2] and c[3] <= e
                    and not any(s2 <= c[2] and c[3] <= e2 for s2, e2 in phases))
        out.append(e - s - inside - moves)
    return out


def permit_s(res: dict[str, Any]) -> tuple[float, int]:
    """Seconds the driver waited in permit opens/closes, and how many it ran."""
    log = res.get("permits") or []
    return float(sum(row[3] for row in log)), len(log)


def busy(records: list[dict[str, Any]], jobs: set[str], span: tuple[float, float]) -> dict[str, float]:
    """Fraction of `span` each node held a permit of one of `jobs`."""
    length = max(span[1] - span[0], 1e-9)
    out: dict[str, float] = {}
    for r in records:
        if r["job"] in jobs:
            out[r["node"]] = out.get(r["node"], 0.0) + (min(r["t_end"], span[1]) - max(r["t_start"], span[0]))
    return {n: v / length for n, v in sorted(out.items())}


def measure(wd: Path, steps: int, timeout_s: float) -> dict[str, Any]:
    """Build every job at once, then run the scenarios one at a time.

    Each opted-in scenario has its own coordinator and sidecars: the coordinator's round-robin waits
    for every registered job's turn, so a job registered but parked (built, waiting for its scenario)
    would hold up the jobs that run.
    """
    build_assets(wd)
    scenario = {"o-a": "o-a", "d-a": "d-a", "d-b": "d-b", "m-a": "m", "m-b": "m"}
    pools: dict[str, Pools] = {}
    jobs: dict[str, Job] = {}
    try:
        for sc in ("o-a", "d-a", "d-b", "m"):
            (wd / f"pools-{sc}").mkdir(exist_ok=True)
            pools[sc] = Pools(wd / f"pools-{sc}").start()
        jobs["u-a"] = launch("u-a", wd, steps=steps, lr=LR["a"], start_file=_go(wd, "u-a"), timing=True)
        for name, sc in scenario.items():
            jobs[name] = launch(name, wd, steps=steps, lr=LR[name[-1]], start_file=_go(wd, sc), timing=True,
                                disaggregated=name[0] in "dm", extra_env={**pools[sc].job_env(wd / f"events-{sc}.jsonl"), "ROLLMUX_JOB": name})
        t0 = time.monotonic()
        print(f"[roll_cpu] building {len(jobs)} ROLL jobs at once (a few minutes on 2 cores)", flush=True)
        try:
            wait_built(list(jobs.values()), timeout_s)
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None
        print(f"[roll_cpu] built in {time.monotonic() - t0:.0f} s", flush=True)
        res: dict[str, dict[str, Any]] = {}
        for name in ("u-a", "o-a", "d-a", "d-b"):
            print(f"[roll_cpu] running {name} alone", flush=True)
            res.update(_run([jobs[name]], _go(wd, name), timeout_s))
        print("[roll_cpu] running m-a and m-b multiplexed", flush=True)
        res.update(_run([jobs["m-a"], jobs["m-b"]], _go(wd, "m"), timeout_s))
    finally:
        for j in jobs.values():
            j.kill()
        for p in pools.values():
            p.stop()
    records = [r for sc in ("o-a", "d-a", "d-b", "m") for r in phase_records(wd / f"events-{sc}.jsonl")]
    return {"res": res, "records": records}


def _overhead(res: dict[str, Any], steps: int) -> tuple[list[str], float]:
    """Lines on one job alone, unset vs opted in; returns them and the overhead besides offload/reload."""
    u, o = res["u-a"], res["o-a"]
    wall = {n: r["run_s"] / steps for n, r in (("u", u), ("o", o))}
    load = {n: offload_s(r) / steps for n, r in (("u", u), ("o", o))}
    over = wall["o"] / wall["u"] - 1
    over_ex = (wall["o"] - load["o"]) / max(wall["u"] - load["u"], 1e-9) - 1
    med = {n: statistics.median(step_s(r)[1:] or step_s(r)) for n, r in (("u", u), ("o", o))}
    p_s, p_n = permit_s(o)
    rest = {n: statistics.median(outside_s(r)[1:] or outside_s(r)) for n, r in (("u", u), ("o", o))}
    return [
        f"alone, unset:     {wall['u']:6.2f} s/step (offload/reload {load['u']:.2f} s/step; median step after the "
        f"first {med['u']:.2f} s)",
        f"alone, opted in:  {wall['o']:6.2f} s/step (offload/reload {load['o']:.2f} s/step; median step after the "
        f"first {med['o']:.2f} s)",
        f"overhead per step: {over * 100:+.1f} % total, {over_ex * 100:+.1f} % besides offload/reload "
        f"(target <= {TARGET_OVERHEAD * 100:.0f} %); median-step ratio {(med['o'] / med['u'] - 1) * 100:+.1f} %",
        f"  of which permit calls (driver -> gate actor -> sidecar -> coordinator and back): {p_n / steps:.1f} per "
        f"step, {p_s / steps * 1000:.0f} ms/step = {p_s / steps / wall['u'] * 100:.1f} % of the unset step",
        f"  driver time outside ROLL's phase spans and offload/reload (median of the steps after the first): unset "
        f"{rest['u'] * 1000:.0f} ms, opted in {rest['o'] * 1000:.0f} ms per step: {(rest['o'] - rest['u']) * 1000:+.0f} "
        f"ms = {(rest['o'] - rest['u']) / med['u'] * 100:+.1f} % of the unset median step",
    ], over_ex


def report(m: dict[str, Any], steps: int) -> tuple[list[str], bool]:
    res, recs = m["res"], m["records"]
    wall = {n: r["run_s"] for n, r in res.items()}
    over_lines, over_ex = _overhead(res, steps)
    seq = (min(res["d-a"]["t_run"], res["d-b"]["t_run"]), max(res["d-a"]["t_done"], res["d-b"]["t_done"]))
    seq_makespan = wall["d-a"] + wall["d-b"]
    mux = (min(res["m-a"]["t_run"], res["m-b"]["t_run"]), max(res["m-a"]["t_done"], res["m-b"]["t_done"]))
    ratio = (mux[1] - mux[0]) / seq_makespan
    lines = [
        f"steps per job: {steps}",
        *over_lines,
        f"sequential makespan (d-a then d-b, disaggregated): {seq_makespan:7.2f} s",
        f"multiplexed makespan (m-a + m-b):                  {mux[1] - mux[0]:7.2f} s   ratio {ratio:.3f} "
        f"(target < {TARGET_MAKESPAN:.1f})",
        f"per-job slowdown: a {wall['m-a'] / wall['d-a']:.2f}x, b {wall['m-b'] / wall['d-b']:.2f}x",
        "busy fraction per pool (r0 = rollout, t0 = training): sequential "
        + ", ".join(f"{n} {v:.2f}" for n, v in busy(recs, {"d-a", "d-b"}, seq).items())
        + " (over the sequential window incl. the gap between the runs)"
        + "; multiplexed " + ", ".join(f"{n} {v:.2f}" for n, v in busy(recs, {"m-a", "m-b"}, mux).items()),
    ]
    return lines, over_ex <= TARGET_OVERHEAD and ratio < TARGET_MAKESPAN


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="pipeline steps per job (default 4)")
    ap.add_argument("--out", default=None, help="folder for the jobs' logs and phase records (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for any build or run (default 900)")
    ap.add_argument("--check", action="store_true", help="exit 1 below the targets")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    reason = roll_unavailable()
    if reason:
        print(f"[roll_cpu] cannot run: {reason}", file=sys.stderr)
        return 2
    wd = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="roll_cpu-"))
    wd.mkdir(parents=True, exist_ok=True)
    lines, ok = report(measure(wd, args.steps, args.timeout), args.steps)
    print("\n".join(lines))
    print(f"[roll_cpu] logs and phase records in {wd}; targets {'met' if ok else 'MISSED'}")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
