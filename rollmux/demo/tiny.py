"""``rollmux demo``: three tiny GRPO jobs multiplexed over a rollout core and a training core.

Steps: (1) start an embedded coordinator and one sidecar per pool (pool = one CPU core);
(2) run each job alone on both cores for a few iterations to measure its solo iteration time;
(3) register the jobs with those times and run them together through RollMux permits, with a live
view; (4) print the summary (throughput per core and per job vs solo, bubble fraction per pool) and
draw the Gantt chart of the interleaved phases.

Torch is imported only by the job processes it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmux.core.errors import RollMuxError, SpecError
from rollmux.demo.conservation import work_json
from rollmux.demo.launch import (
    JobKnobs,
    LaunchError,
    LocalCluster,
    Pools,
    RunningJob,
    interrupt_safe,
    read_jsonl,
)
from rollmux.demo.report import Summary, gantt, solo_iteration_s, solo_phase_s, summarize

HELP = ("three tiny GRPO jobs run solo, then multiplexed through an embedded coordinator and two "
        "sidecars (one CPU core per pool); live view, summary and a Gantt PNG")

DEMO_JOBS: tuple[JobKnobs, ...] = (
    JobKnobs(name="rollout-heavy", iterations=0, seed=1,
             flags=("--max-new-tokens", "24", "--prompts", "16", "--group-size", "8", "--train-epochs", "1",
                    "--minibatches", "1")),
    JobKnobs(name="train-heavy", iterations=0, seed=2,
             flags=("--max-new-tokens", "8", "--prompts", "12", "--group-size", "8", "--train-epochs", "8",
                    "--minibatches", "4")),
    JobKnobs(name="balanced", iterations=0, seed=3,
             flags=("--max-new-tokens", "12", "--prompts", "16", "--group-size", "8", "--train-epochs", "2",
                    "--minibatches", "2")),
)
"""Phase ratios come from the tiny_grpo knobs: long responses make rollout heavy, many epochs and
minibatches make training heavy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """Knobs of one demo run."""

    out: Path  # where logs, event records, summary.json and gantt.png go
    jobs: tuple[JobKnobs, ...] = DEMO_JOBS
    solo_iterations: int = 4  # per job, alone on both cores (the first is warm-up)
    mux_seconds: float = 50.0  # target length of the multiplexed run
    slo: float = 8.0  # loose on purpose: three jobs share two cores, and a short job (balanced) is many
    # times slower than alone; a tight SLO would make the policy queue it until the others finish
    fill_saturated: bool = True  # pack the third job into the (saturated) group while SLOs hold
    live: bool = True  # rich live view
    pools: Pools = Pools()

    def __post_init__(self) -> None:
        if self.solo_iterations < 2:
            raise SpecError(f"solo_iterations={self.solo_iterations}: the first solo iteration is warm-up, so at "
                            "least 2 are needed to measure one; pass --solo-iterations 2 or more")
        if self.mux_seconds <= 0:
            raise SpecError(f"mux_seconds={self.mux_seconds}: the multiplexed part needs a positive length; "
                            "pass --seconds > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class SoloResult:
    iteration_s: float
    rollout_s: float
    train_s: float  # train + sync


def run_solo(cluster: LocalCluster, knobs: JobKnobs, iterations: int, view: Any) -> SoloResult:
    """The job alone, ungated, trainer on the train core and rollout worker on the rollout core."""
    from dataclasses import replace

    job = cluster.launch(replace(knobs, iterations=iterations), token=None, tag="-solo")
    _wait([job], view, "solo")
    recs = job.records()
    return SoloResult(iteration_s=solo_iteration_s(recs), rollout_s=solo_phase_s(recs, "rollout"),
                      train_s=solo_phase_s(recs, "train") + solo_phase_s(recs, "sync"))


def _wait(jobs: list[RunningJob], view: Any, mode: str) -> None:
    while True:
        codes = [j.poll() for j in jobs]
        if view is not None:
            view(jobs, mode)
        failed = [(j, c) for j, c in zip(jobs, codes) if c not in (None, 0)]
        if failed:
            j, c = failed[0]
            raise LaunchError(f"job {j.knobs.name} exited with code {c}; see {j.log_file.parent}/"
                              f"{j.knobs.name}*-r*.log")
        if all(c == 0 for c in codes):
            return
        time.sleep(0.25)


def run_demo(cfg: DemoConfig) -> Summary:
    """Run the whole demo; returns the summary (also written to ``out/summary.json``)."""
    from dataclasses import replace

    from rich.console import Console
    from rich.live import Live

    from rollmux.demo.view import LiveView, summary_table

    console = Console()
    cfg.out.mkdir(parents=True, exist_ok=True)
    for f in cfg.out.glob("*.jsonl"):
        f.unlink()
    started = time.monotonic()
    view = LiveView(cfg.out / "phases.jsonl")
    with interrupt_safe(), LocalCluster(cfg.out, pools=cfg.pools, fill_saturated=cfg.fill_saturated) as cluster, \
            Live(view.render([], "starting"), console=console, refresh_per_second=4,
                 transient=False) if cfg.live else _NullLive() as live:
        def show(jobs: list[RunningJob], mode: str) -> None:
            live.update(view.render(jobs, mode))

        solo: dict[str, SoloResult] = {}
        for knobs in cfg.jobs:
            solo[knobs.name] = run_solo(cluster, knobs, cfg.solo_iterations, show)
            view.solo[knobs.name] = solo[knobs.name].iteration_s
        period = max(sum(s.rollout_s for s in solo.values()), sum(s.train_s for s in solo.values()),
                     max(s.iteration_s for s in solo.values()))
        iterations = max(8, min(400, round(cfg.mux_seconds / (period * 1.15))))
        running = []
        for knobs in cfg.jobs:
            s = solo[knobs.name]
            token = cluster.register(knobs, t_roll_s=s.rollout_s, t_train_s=s.train_s, slo=cfg.slo)
            running.append((replace(knobs, iterations=iterations), token))
        state = cluster.client.cluster_state()
        pending = [j.job for j in state.jobs if j.state != "admitted"]
        if pending:
            console.print(f"[yellow]not admitted yet (the policy queues them): {', '.join(pending)}[/]")
        jobs = [cluster.launch(k, t) for k, t in running]
        _wait(jobs, show, "rollmux")
    records = read_jsonl(cfg.out / "phases.jsonl")
    summary = summarize({k: s.iteration_s for k, s in solo.items()}, records)
    png = gantt(records, cfg.out / "gantt.png",
                title=f"rollmux demo: {len(cfg.jobs)} tiny GRPO jobs on a rollout core and a training core "
                      f"(ratio {summary.ratio:.2f}x throughput per core vs solo)")
    (cfg.out / "summary.json").write_text(json.dumps({
        "solo_iteration_s": summary.solo_s, "mux_iteration_s": summary.mux_s, "slowdown": summary.slowdown,
        "solo_iters_per_s_per_core": summary.solo_per_core, "mux_iters_per_s_per_core": summary.mux_per_core,
        "throughput_per_core_ratio": summary.ratio, "busy_fraction": summary.busy,
        "bubble_fraction": {p: 1 - b for p, b in summary.busy.items()}, "steady_window_s": summary.window_s,
        "cpu_share_of_phase_bodies": summary.cpu_share,
        "loadavg": os.getloadavg(), "overlapping_phases": summary.overlaps, "order_violations": summary.order_problems,
        **(work_json(summary.work) if summary.work is not None else {}),
        "iterations_multiplexed": iterations, "wall_s": time.monotonic() - started}, indent=2))
    console.print(summary_table(summary))
    if summary.window_s <= 0:
        console.print("[yellow]the jobs never all ran at the same time (the policy queued one of them): there is "
                      "no multiplexed window to measure; see nodes.jsonl[/]")
    console.print(f"Gantt chart: {png}   summary: {cfg.out / 'summary.json'}   total wall time "
                  f"{time.monotonic() - started:.0f}s")
    return summary


class _NullLive:
    def __enter__(self) -> _NullLive:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: Any) -> None:
        return None


def configure(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--seconds", type=float, default=50.0, help="target length of the multiplexed part")
    group.add_argument("--solo-iterations", type=int, default=4, help="iterations of each solo measurement")
    group.add_argument("--rollout-cpu", type=int, default=0, help="CPU core of the rollout pool")
    group.add_argument("--train-cpu", type=int, default=1, help="CPU core of the training pool")


def run(args: argparse.Namespace) -> int:
    """Run the demo from parsed options; 0 when no two phases overlapped and every job kept its order."""
    try:
        summary = run_demo(DemoConfig(
            out=args.out, mux_seconds=args.seconds, solo_iterations=args.solo_iterations, live=not args.no_live,
            pools=Pools(rollout_cpu=args.rollout_cpu, train_cpu=args.train_cpu)))
    except KeyboardInterrupt:
        print("rollmux demo: interrupted; all child processes were stopped")
        return 130
    except RollMuxError as exc:
        print(f"rollmux demo: {exc}")
        return 1
    return 0 if summary.overlaps == 0 and summary.order_problems == 0 else 1
