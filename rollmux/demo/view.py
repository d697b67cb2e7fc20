"""The demo's live progress view and its closing summary table (rich renderables)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from rollmux.demo.launch import RunningJob, read_jsonl
from rollmux.demo.report import Summary


class LiveView:
    """Reads the trainer logs and the phase records each refresh; renders one row per job."""

    def __init__(self, phases: Path) -> None:
        self.phases = phases
        self.solo: dict[str, float] = {}  # job -> solo iteration s, once measured

    def render(self, jobs: list[RunningJob], mode: str) -> Table:
        t = Table(title=f"rollmux demo - {mode}", title_justify="left")
        for col in ("job", "mode", "phase (last)", "iteration", "reward", "it/s", "solo it/s"):
            t.add_column(col, justify="left" if col in ("job", "mode", "phase (last)") else "right")
        last: dict[str, dict[str, Any]] = {}
        if mode == "rollmux":
            for r in read_jsonl(self.phases):
                if r.get("owner"):
                    last[r["job"]] = r
        for j in jobs:
            recs = j.records()
            name = j.knobs.name
            it = f"{len(recs)}/{j.knobs.iterations}"
            reward = f"{recs[-1]['reward_mean']:.3f}" if recs else "-"
            rate = "-"
            if len(recs) >= 2 and recs[-1]["elapsed_s"] > recs[0]["elapsed_s"]:
                rate = f"{(len(recs) - 1) / (recs[-1]['elapsed_s'] - recs[0]['elapsed_s']):.2f}"
            ph = last.get(name)
            phase = f"{ph['phase']}({ph['iteration']}) on {ph['node']}" if ph else ("starting" if not recs else "-")
            solo = f"{1 / self.solo[name]:.2f}" if name in self.solo else "-"
            t.add_row(name, mode, phase, it, reward, rate, solo)
        return t


def summary_table(s: Summary) -> Table:
    t = Table(title="rollmux demo - summary (steady window: all jobs running)", title_justify="left")
    for col in ("job", "solo s/it", "rollmux s/it", "slowdown"):
        t.add_column(col, justify="left" if col == "job" else "right")
    for job in s.solo_s:
        mux = s.mux_s[job]
        t.add_row(job, f"{s.solo_s[job]:.3f}", "-" if math.isnan(mux) else f"{mux:.3f}",
                  "-" if math.isnan(mux) else f"{s.slowdown[job]:.2f}x")
    t.add_section()
    t.add_row("throughput per core", f"{s.solo_per_core:.3f} it/s", f"{s.mux_per_core:.3f} it/s", f"{s.ratio:.2f}x")
    t.add_row("bubble, rollout core", "", f"{1 - s.busy['rollout']:.0%}", "")
    t.add_row("bubble, train core", "", f"{1 - s.busy['train']:.0%}", "")
    t.add_row("CPU share of phase bodies", "", f"{s.cpu_share:.0%}", "")
    t.add_row("overlapping phases / order violations", "", f"{s.overlaps} / {s.order_problems}", "")
    if s.work is not None:
        w = s.work
        t.add_row("idle while a phase waited (share)", "", f"{w.idle_runnable_s:.2f} node-s",
                  f"{w.idle_runnable_share:.1%}")
        t.add_row("handoff p50 / p99 (ms)", "", f"{w.quantile_ms(0.5):.1f} / {w.quantile_ms(0.99):.1f}",
                  f"{len(w.handoffs)}")
    return t
