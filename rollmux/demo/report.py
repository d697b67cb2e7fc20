"""What a multiplexed run did, from the shim's phase records: checks, figures and a Gantt chart.

Input is the JSON-lines file every opted-in rank appends to (``ROLLMUX_EVENT_LOG``): one record per
phase with its node, job, iteration, permit epoch and wall-clock times. Only *owned* phases (the
rank held the permit) occupy a node; follower records are ignored here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmux.core.model import phase_key
from rollmux.demo.conservation import Conservation, conservation


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One owned phase on one node."""

    node: str
    pool: str  # rollout | train
    job: str
    phase: str
    iteration: int
    epoch: int
    start: float  # wall s, permit in hand (state reload begins)
    end: float  # wall s, state offloaded (release follows)
    body_wall_s: float = 0.0  # wall time of the phase body
    body_cpu_s: float = 0.0  # CPU time the rank's process got during the body


def spans(records: Iterable[dict[str, Any]]) -> list[Span]:
    """Owned phases, sorted by start."""
    out = [Span(node=r["node"], pool=r["pool"], job=r["job"], phase=r["phase"], iteration=int(r["iteration"]),
                epoch=int(r["epoch"]), start=float(r["t_start"]), end=float(r["t_end"]),
                body_wall_s=float(r.get("t_body_end", r["t_end"])) - float(r["t_start"]),
                body_cpu_s=float(r.get("body_cpu_s", 0.0)))
           for r in records if r.get("owner")]
    return sorted(out, key=lambda s: s.start)


def overlaps(all_spans: Sequence[Span], slack_s: float = 0.0) -> list[tuple[Span, Span]]:
    """Pairs of phases that ran on the same node at the same time (must be empty)."""
    bad = []
    by_node: dict[str, list[Span]] = defaultdict(list)
    for s in all_spans:
        by_node[s.node].append(s)
    for node_spans in by_node.values():
        node_spans.sort(key=lambda s: s.start)
        for a, b in zip(node_spans, node_spans[1:]):
            if b.start < a.end - slack_s:
                bad.append((a, b))
    return bad


def order_violations(all_spans: Sequence[Span]) -> list[str]:
    """Per job, owned phases must follow Rollout(i) -> Train(i) -> Sync(i) -> Rollout(i+1), in time."""
    problems = []
    by_job: dict[str, list[Span]] = defaultdict(list)
    for s in all_spans:
        by_job[s.job].append(s)
    for job, js in by_job.items():
        js.sort(key=lambda s: s.start)
        keys = [phase_key(s.phase, s.iteration) for s in js]
        if keys != sorted(keys) or len(set(keys)) != len(keys):
            problems.append(f"job {job}: phases out of on-policy order: {keys[:12]}")
        for a, b in zip(js, js[1:]):
            if b.start < a.end:
                problems.append(f"job {job}: {b.phase}({b.iteration}) started before {a.phase}({a.iteration}) ended")
    return problems


def steady_window(all_spans: Sequence[Span]) -> tuple[float, float]:
    """The window in which every job was running: latest first start to earliest last end."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in all_spans:
        first[s.job] = min(first.get(s.job, s.start), s.start)
        last[s.job] = max(last.get(s.job, s.end), s.end)
    return max(first.values()), min(last.values())


def busy_fraction(all_spans: Sequence[Span], pool: str, window: tuple[float, float]) -> float:
    """Share of `window` during which the pool's node ran some owned phase."""
    lo, hi = window
    if hi <= lo:
        return 0.0
    busy, cur_end = 0.0, lo
    for s in sorted((s for s in all_spans if s.pool == pool), key=lambda s: s.start):
        a, b = max(s.start, cur_end), min(s.end, hi)
        if b > a:
            busy += b - a
        cur_end = max(cur_end, min(s.end, hi))
    return busy / (hi - lo)


def iteration_time_in_window(all_spans: Sequence[Span], job: str, window: tuple[float, float]) -> float | None:
    """Mean iteration period of `job` inside `window` (from its train-phase ends)."""
    ends = sorted(s.end for s in all_spans if s.job == job and s.phase == "train" and window[0] <= s.end <= window[1])
    if len(ends) < 2:
        return None
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def solo_iteration_s(trainer_records: Sequence[dict[str, Any]]) -> float:
    """Median iteration period of an ungated run (skipping the first, warm-up iteration)."""
    el = [r["elapsed_s"] for r in trainer_records]
    d = [b - a for a, b in zip(el, el[1:])]
    return statistics.median(d[1:] if len(d) > 2 else d)


def solo_phase_s(trainer_records: Sequence[dict[str, Any]], phase: str) -> float:
    vals = [r["phase_s"][phase] for r in trainer_records[1:]] or [r["phase_s"][phase] for r in trainer_records]
    return statistics.median(vals)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Multiplexed vs solo-disaggregated, per job and in aggregate."""

    solo_s: dict[str, float]  # job -> solo iteration period (alone on 2 cores), s
    mux_s: dict[str, float]  # job -> multiplexed iteration period (steady window), s
    window_s: float  # length of the steady window, s
    busy: dict[str, float]  # pool -> busy fraction in the window
    overlaps: int  # must be 0
    order_problems: int  # must be 0
    cpu_share: float  # CPU time / wall time of phase bodies in the window (1.0 = each phase had its core)
    work: Conservation | None = None  # idle-while-runnable and handoffs in the window (rollmux.demo.conservation)

    @property
    def slowdown(self) -> dict[str, float]:
        return {j: self.mux_s[j] / self.solo_s[j] for j in self.mux_s}

    @property
    def solo_per_core(self) -> float:
        """Iterations/s per core with each job alone on its own 2 cores."""
        return sum(1.0 / t for t in self.solo_s.values()) / (2 * len(self.solo_s))

    @property
    def mux_per_core(self) -> float:
        """Iterations/s per core with every job multiplexed on the same 2 cores."""
        return sum(1.0 / t for t in self.mux_s.values()) / 2

    @property
    def ratio(self) -> float:
        return self.mux_per_core / self.solo_per_core


def summarize(solo_s: dict[str, float], records: Iterable[dict[str, Any]]) -> Summary:
    records = list(records)
    sp = spans(records)
    win = steady_window(sp)
    mux = {}
    for job in solo_s:
        t = iteration_time_in_window(sp, job, win)
        mux[job] = t if t is not None else float("nan")
    return Summary(solo_s=dict(solo_s), mux_s=mux, window_s=win[1] - win[0],
                   busy={p: busy_fraction(sp, p, win) for p in ("rollout", "train")},
                   overlaps=len(overlaps(sp)), order_problems=len(order_violations(sp)),
                   cpu_share=cpu_share(sp, win), work=conservation(records, win))


def cpu_share(all_spans: Sequence[Span], window: tuple[float, float]) -> float:
    """How much of its core a phase body really got (below 1: other processes ran on that core)."""
    inside = [s for s in all_spans if window[0] <= s.start <= window[1] and s.body_wall_s > 0]
    wall = sum(s.body_wall_s for s in inside)
    return sum(s.body_cpu_s for s in inside) / wall if wall > 0 else float("nan")


PLOTS_HINT = "not drawn, matplotlib is not installed (pip install matplotlib draws it)"
"""What the demo prints instead of the picture's path when matplotlib is missing (no square brackets:
the demo prints through rich, which reads them as markup)."""


def gantt(records: Iterable[dict[str, Any]], path: Path, *, title: str, zoom_s: float = 8.0) -> Path | str:
    """Two panels: the whole run, and a `zoom_s` slice of the steady window; one row per pool.

    Returns:
        The PNG's path; without matplotlib (the ``plots`` extra, not a base dependency, so a slim
        install stays slim) no picture and :data:`PLOTS_HINT`, which the demo prints in its place.
    """
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        return PLOTS_HINT

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sp = spans(records)
    t0 = min(s.start for s in sp)
    jobs = sorted({s.job for s in sp})
    colors = dict(zip(jobs, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]))
    rows = {"rollout": 1, "train": 0}
    win = steady_window(sp)
    mid = (win[0] + win[1]) / 2 - t0
    zoom = (max(0.0, mid - zoom_s / 2), mid + zoom_s / 2)
    fig, axes = plt.subplots(2, 1, figsize=(13, 6.5), gridspec_kw={"height_ratios": [1, 1.3]})
    for ax, (lo, hi), label in ((axes[0], (0.0, max(s.end for s in sp) - t0), "whole run"),
                                (axes[1], zoom, f"zoom: {zoom_s:g} s of the steady state")):
        for s in sp:
            a, b = s.start - t0, s.end - t0
            if b < lo or a > hi:
                continue
            ax.barh(rows[s.pool], b - a, left=a, height=0.6, color=colors[s.job],
                    alpha=0.55 if s.phase == "sync" else 0.95, hatch="//" if s.phase == "sync" else None,
                    edgecolor="black", linewidth=0.3)
            if ax is axes[1] and b - a > 0.12 * zoom_s / 8:
                ax.text((max(a, lo) + min(b, hi)) / 2, rows[s.pool], f"{s.phase[0].upper()}{s.iteration}",
                        ha="center", va="center", fontsize=7, clip_on=True)
        ax.set_yticks([0, 1], ["train pool\n(core 1)", "rollout pool\n(core 0)"])
        ax.set_xlim(lo, hi)
        ax.set_xlabel("seconds since the first phase")
        ax.set_title(label, fontsize=10, loc="left")
        if ax is axes[0]:
            ax.axvspan(win[0] - t0, win[1] - t0, color="grey", alpha=0.08)
            ax.axvspan(zoom[0], zoom[1], color="gold", alpha=0.25)
    handles = [Patch(color=colors[j], label=j) for j in jobs]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="sync phase"))
    fig.suptitle(title, x=0.01, y=0.99, ha="left", fontsize=11)
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.01, 0.955), ncol=len(handles), fontsize=9,
               frameon=False)
    fig.text(0.01, 0.005, "R = rollout, T = train, S = sync; number = iteration. Grey: all jobs running; "
             "gold: the zoomed slice.", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
