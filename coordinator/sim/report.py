"""Terminal output: one rich table row per policy, ratios against RollMux."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from rollmux.coordinator.sim.metrics import PolicySummary


def summary_table(summaries: Sequence[PolicySummary], title: str) -> Table:
    ref = next((s for s in summaries if s.policy == "rollmux"), None)
    table = Table(title=title, title_justify="left")
    for col, just in (("policy", "left"), ("avg $/h", "right"), ("peak $/h", "right"), ("total $", "right"),
                      ("peak GPUs R/T", "right"), ("SLO met", "right"), ("SLO vs plan", "right"), ("bubble R/T", "right"),
                      ("mean JCT h", "right"), ("slowdown", "right"), ("x RollMux cost", "right"), ("sim s", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in summaries:
        ratio = f"{s.avg_cost_per_hour / ref.avg_cost_per_hour:.2f}x" if ref else "-"
        table.add_row(s.policy, f"{s.avg_cost_per_hour:,.0f}", f"{s.peak_cost_per_hour:,.0f}", f"{s.total_usd:,.0f}",
                      f"{s.peak_gpus_rollout}/{s.peak_gpus_train}", f"{100 * s.slo_attainment:.1f}%", f"{100 * s.slo_attainment_planned:.1f}%",
                      f"{100 * s.bubble_rollout:.0f}%/{100 * s.bubble_train:.0f}%", f"{s.mean_jct_h:.1f}",
                      f"{s.mean_slowdown:.2f}", ratio, f"{s.wall_s:.1f}")
    return table


def print_summaries(summaries: Sequence[PolicySummary], title: str, console: Console | None = None) -> None:
    console = console or Console()
    # Not a terminal (pipes, CI logs): rich would wrap to 80 columns and truncate every cell.
    if not console.is_terminal and console.width < 150:
        console = Console(width=150, file=console.file)
    console.print(summary_table(summaries, title))
