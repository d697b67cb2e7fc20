"""``rollmux demo --verl``: two real veRL 0.9.1 GRPO jobs multiplexed on this CPU machine.

Both jobs run unmodified ``python -m verl.trainer.main_ppo`` on the veRL CPU harness (a tiny random
Qwen2 built locally, nothing downloaded), opted in by their environment only, against redis-server,
a Redis-backed coordinator and one sidecar per pool. A live view shows each job's last phase and
step; at the end the phase records are checked (no two phases on a node at once, on-policy order per
job) and drawn as a Gantt chart.

The harness lives in the source tree (``tests/adapters/verl/harness/``) and is not in the wheel: this
demo needs a source checkout set up with ``bash scripts/setup.sh --dev`` (veRL 0.9.1, redis-server).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HELP = ("two real veRL 0.9.1 GRPO jobs multiplexed on the CPU harness (Redis, coordinator, sidecars); "
        "live view and a Gantt PNG; needs a source checkout with scripts/setup.sh --dev")

HARNESS = Path(__file__).resolve().parents[2] / "tests" / "adapters" / "verl" / "harness"
JOBS = (("verl-a", 0, 8), ("verl-b", 1, 12))  # name, seed, response length


def configure(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--steps", type=int, default=2, help="veRL training steps per job (--verl)")


def _preflight() -> str | None:
    """Why the demo cannot run here, or None."""
    if not (HARNESS / "scenario.py").exists():
        return (f"the veRL CPU harness is not at {HARNESS}: it ships with the source tree, not the wheel: this demo needs a source checkout. Run "
                "from a checkout: git clone <rollmux repo> && cd rollmux && bash scripts/setup.sh --dev && "
                ".venv/bin/rollmux demo --verl")
    if importlib.util.find_spec("verl") is None:
        return "veRL is not installed in this environment: bash scripts/setup.sh --dev installs verl 0.9.1"
    return None


def _table(jobs: list[Any], running: dict[str, Any], events: Path, job_mod: Any) -> Any:
    from rich.table import Table

    last: dict[str, dict[str, Any]] = {}
    for r in job_mod.read_jsonl(events):
        if r.get("owner"):
            last[r["job"]] = r
    t = Table(title="rollmux demo --verl: two veRL GRPO jobs multiplexed", title_justify="left")
    for col in ("job", "state", "phase (last)", "steps done"):
        t.add_column(col)
    for j in jobs:
        log = j.workdir / "job.log"
        done = len(job_mod.step_metrics(log)) if log.exists() else 0
        ph = last.get(j.name)
        t.add_row(j.name, "running" if j.name in running else "finished",
                  f"{ph['phase']}({ph['iteration']}) on {ph['node']}" if ph else "starting",
                  f"{done}/{j.steps}")
    return t


def run(args: argparse.Namespace) -> int:
    """Run both jobs; 0 when both finished and the phase records are consistent."""
    why = _preflight()
    if why:
        print(f"rollmux demo --verl: {why}", file=sys.stderr)
        return 2
    if args.steps < 1:
        print("rollmux demo --verl: --steps must be >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HARNESS))
    import assets
    import job as job_mod
    import scenario
    from rich.console import Console
    from rich.live import Live

    from rollmux.demo.launch import interrupt_safe
    from rollmux.demo.report import gantt, order_violations, overlaps, spans
    from rollmux.demo.tiny import _NullLive

    out: Path = args.out
    console = Console()
    model = assets.build(out / "assets")
    jobs = [job_mod.VerlJob(name=n, assets=model, workdir=out / n, steps=args.steps, seed=s, response_length=r)
            for n, s, r in JOBS]
    console.print(f"logs and phase records under {out}; veRL starts slowly on CPU (about a minute per job)")
    try:
        with interrupt_safe(), scenario.rollmux_setup(out / "rollmux") as cluster:
            with Live(_table(jobs, {}, cluster.events, job_mod), console=console, refresh_per_second=2,
                      transient=False) if not args.no_live else _NullLive() as live:
                done = scenario.run([(j, scenario.opt_in(cluster, j.name)) for j in jobs],
                                    watch=lambda r: live.update(_table(jobs, r, cluster.events, job_mod)))
            records = job_mod.read_jsonl(cluster.events)
    except KeyboardInterrupt:
        print("rollmux demo --verl: interrupted; all child processes were stopped")
        return 130
    finally:
        import shutil

        for j in jobs:
            shutil.rmtree(j.ray_tmp(), ignore_errors=True)
    failed = {n: f.rc for n, f in done.items() if f.rc}
    sp = spans(records)
    bad = [*map(str, overlaps(sp)), *order_violations(sp)]
    png = gantt(records, out / "gantt.png", title="rollmux demo --verl: two veRL GRPO jobs (CPU harness)")
    (out / "summary.json").write_text(json.dumps({"rc": {n: f.rc for n, f in done.items()},
                                                  "wall_s": {n: f.wall_s for n, f in done.items()},
                                                  "owned_phases": len(sp), "problems": bad}, indent=2))
    for n, f in done.items():
        console.print(f"{n}: exit {f.rc}, {f.wall_s:.0f}s, log {f.job.workdir / 'job.log'}")
    console.print(f"{len(sp)} owned phases, {len(bad)} overlaps/order problems; Gantt chart: {png}")
    return 1 if failed or bad else 0
