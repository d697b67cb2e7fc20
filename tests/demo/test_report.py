"""Checks and figures over phase records: overlap and order detection, busy fraction, the Gantt PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.demo.report import busy_fraction, gantt, order_violations, overlaps, spans, summarize


def rec(job: str, phase: str, it: int, start: float, end: float, node: str | None = None) -> dict:
    pool = "rollout" if phase == "rollout" else "train"
    return {"job": job, "rank": 0, "node": node or f"{pool}-0", "pool": pool, "phase": phase, "iteration": it,
            "owner": True, "epoch": 1, "t_request": start, "t_start": start, "t_body_end": end, "t_end": end,
            "t_released": end, "body_cpu_s": (end - start) / 2}


def two_jobs(iterations: int = 4) -> list[dict]:
    out, t = [], 0.0
    for i in range(iterations):  # a: R on rollout while b trains, then swap
        out += [rec("a", "rollout", i, t, t + 1), rec("b", "train", i, t, t + 0.9), rec("b", "sync", i, t + 0.9, t + 1),
                rec("b", "rollout", i + 1, t + 1, t + 2), rec("a", "train", i, t + 1, t + 1.9),
                rec("a", "sync", i, t + 1.9, t + 2)]
        t += 2
    return out


def test_interleaved_schedule_has_no_overlap_and_full_pools() -> None:
    sp = spans(two_jobs())
    assert overlaps(sp) == []
    assert busy_fraction(sp, "rollout", (0.0, 8.0)) == pytest.approx(1.0)
    s = summarize({"a": 2.0, "b": 2.0}, two_jobs())
    assert s.overlaps == 0 and s.cpu_share == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [
    [rec("a", "rollout", 0, 0, 1), rec("b", "rollout", 0, 0.5, 1.5)],
    [rec("a", "train", 0, 0, 1), rec("b", "sync", 0, 0.99, 1.2)],
], ids=["rollouts-overlap", "train-and-sync-overlap"])
def test_overlap_on_a_node_is_reported(bad: list[dict]) -> None:
    assert len(overlaps(spans(bad))) == 1


def test_out_of_order_phases_are_reported() -> None:
    sp = spans([rec("a", "train", 0, 0, 1), rec("a", "rollout", 0, 1, 2)])
    assert order_violations(sp)


def test_gantt_png_is_written(tmp_path: Path) -> None:
    path = gantt(two_jobs(), tmp_path / "g.png", title="test", zoom_s=3)
    assert path.stat().st_size > 10_000
