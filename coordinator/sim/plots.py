"""PNG figures of a simulation: cost over time, GPUs per pool over time, Gantt of one busy group.

matplotlib is imported inside the functions (Agg backend) so the simulator runs without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rollmux.coordinator.policy.intra_group import PhaseInterval
from rollmux.coordinator.sim.api import PolicyRun
from rollmux.core.model import Phase


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _steps(run: PolicyRun, attr: str) -> tuple[list[float], list[float]]:
    end = max(j.finish_s for j in run.jobs)
    pts = sorted(run.timeline, key=lambda p: p.t_s)
    xs = [p.t_s / 3600 for p in pts] + [end / 3600]
    ys = [float(getattr(p, attr)) for p in pts]
    return xs, ys + ys[-1:]


def plot_cost(runs: Mapping[str, PolicyRun], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for name, run in runs.items():
        xs, ys = _steps(run, "usd_per_h")
        ax.step(xs, ys, where="post", label=name, linewidth=2.2 if name == "rollmux" else 1.0,
                zorder=3 if name == "rollmux" else 2)
    ax.set_xlabel("time since first arrival (h)")
    ax.set_ylabel("provisioned cost ($/h)")
    ax.set_title("Cluster cost over time (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(ncol=4, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gpus(runs: Mapping[str, PolicyRun], path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for ax, attr, label in ((axes[0], "rollout_gpus", "rollout pool (H20) GPUs"),
                            (axes[1], "train_gpus", "training pool (H800) GPUs")):
        for name, run in runs.items():
            xs, ys = _steps(run, attr)
            ax.step(xs, ys, where="post", label=name, linewidth=2.2 if name == "rollmux" else 1.0)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title("GPUs in use per pool")
    axes[0].legend(ncol=4, fontsize=9)
    axes[1].set_xlabel("time since first arrival (h)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def busiest_window(intervals: tuple[PhaseInterval, ...], cycles: int = 3, width: int = 60) -> tuple[float, float] | None:
    """About `cycles` meta-iterations starting where the most distinct jobs run within `width` phases."""
    if not intervals:
        return None
    ivs = sorted(intervals, key=lambda i: i.start_s)
    best_k, best_n = 0, 0
    for k in range(0, len(ivs), max(1, len(ivs) // 400)):
        n = len({i.job for i in ivs[k:k + width]})
        if n > best_n:
            best_k, best_n = k, n
    chunk = ivs[best_k:best_k + width]
    starts: dict[str, list[float]] = {}
    for i in chunk:
        if i.phase is Phase.ROLLOUT:
            starts.setdefault(i.job, []).append(i.start_s)
    gaps = sorted(b - a for s in starts.values() for a, b in zip(s, s[1:]))
    period = gaps[len(gaps) // 2] if gaps else max(i.end_s for i in chunk) - chunk[0].start_s
    t0 = chunk[0].start_s
    return t0, t0 + cycles * max(period, 1.0)


def plot_gantt(run: PolicyRun, path: Path, group_id: str | None = None) -> Path | None:
    """Interleaved phases of the group that held the most jobs at once (or `group_id`)."""
    if not run.intervals:
        return None
    gid = group_id or max(run.intervals, key=lambda g: (len({i.job for i in run.intervals[g]}), len(run.intervals[g])))
    window = busiest_window(run.intervals[gid])
    assert window is not None
    t0, t1 = window
    shown = [i for i in run.intervals[gid] if i.end_s > t0 and i.start_s < t1 and i.end_s > i.start_s]
    rows = sorted({str(n) for i in shown if i.phase is Phase.ROLLOUT for n in i.nodes}) + ["train"]
    jobs = sorted({i.job for i in shown})
    plt = _plt()
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(rows)))
    for i in shown:
        nodes = [str(n) for n in i.nodes] if i.phase is Phase.ROLLOUT else ["train"]
        c = colors(jobs.index(i.job) % 10)
        head_end = i.end_s if i.released_s is None else i.released_s
        for n in nodes:
            y = rows.index(n)
            ax.broken_barh([((i.start_s - t0) / 60, (head_end - i.start_s) / 60)], (y - 0.38, 0.76),
                           facecolors=c, edgecolors="black", linewidth=0.4,
                           hatch="//" if i.phase is Phase.TRAIN else None)
            if head_end < i.end_s:  # long-tail migration: the tail runs on a few GPUs beside the next rollout
                ax.broken_barh([((head_end - t0) / 60, (i.end_s - head_end) / 60)], (y + 0.22, 0.16),
                               facecolors=c, edgecolors="black", linewidth=0.3)
    ax.set_yticks(range(len(rows)), [f"rollout node {r}" if r != "train" else "training pool" for r in rows])
    ax.set_xlim(0, (t1 - t0) / 60)
    ax.set_xlabel(f"minutes since t = {t0 / 3600:.1f} h")
    ax.set_title(f"Group {gid}: round-robin meta-iterations (solid = rollout, thin = its migrated tail, "
                 "hatched = train)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors(k % 10)) for k in range(len(jobs))]
    ax.legend(handles, jobs, ncol=min(6, len(jobs)), fontsize=8, loc="upper right", bbox_to_anchor=(1, -0.25 if len(rows) < 3 else -0.12))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(runs: Mapping[str, PolicyRun], directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_cost(runs, out / "cost_over_time.png"), plot_gpus(runs, out / "gpus_per_pool.png")]
    if "rollmux" in runs:
        g = plot_gantt(runs["rollmux"], out / "gantt_rollmux_group.png")
        if g is not None:
            paths.append(g)
    return paths
