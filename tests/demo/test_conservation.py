"""Work conservation from phase records: idle-while-runnable and handoffs, on hand-built records."""

from __future__ import annotations

import pytest

from rollmux.demo.conservation import conservation, work_json


def rec(job: str, node: str, asked: float, start: float, end: float, *, phase: str = "rollout", it: int = 0,
        owner: bool = True) -> dict:
    return {"job": job, "node": node, "pool": "rollout", "phase": phase, "iteration": it, "owner": owner,
            "epoch": 1, "t_request": asked, "t_start": start, "t_end": end}


@pytest.mark.parametrize(("records", "idle_runnable_s", "handoffs"), [
    pytest.param([rec("a", "n", 0, 0, 1), rec("b", "n", 0.5, 1.002, 2)], 0.002, 1,
                 id="waiting phase starts 2 ms after the node frees: a 2 ms handoff"),
    pytest.param([rec("a", "n", 0, 0, 1), rec("b", "n", 1.5, 1.6, 2)], 0.1, 1,
                 id="node idle before the ask: only the time after it counts"),
    pytest.param([rec("a", "n", 0, 0, 1), rec("b", "n", 1.8, 1.8, 2)], 0.0, 0,
                 id="granted at once on asking: nothing waited"),
    pytest.param([rec("a", "n", 0, 0, 1), rec("b", "n", 0.2, 1.5, 2), rec("c", "n", 0.1, 2.0, 3)], 0.5, 1,
                 id="two waiters, node idle half a second: counted once"),
    pytest.param([rec("a", "n", 0, 0, 1), rec("c", "m", 0, 0, 1.5), rec("b", "m", 0.5, 1.5, 2)], 0.0, 0,
                 id="a phase waiting for another, busy node is no loss on this one"),
    pytest.param([rec("a", "n", 0, 0, 1), rec("b", "n", 0.5, 1.5, 2, owner=False)], 0.0, 0,
                 id="follower records occupy no node"),
])
def test_idle_while_a_phase_waited(records, idle_runnable_s, handoffs) -> None:  # noqa: ANN001
    c = conservation(records)
    assert c.idle_runnable_s == pytest.approx(idle_runnable_s, abs=1e-9)
    assert len(c.handoffs) == handoffs


def test_window_clips_and_share_counts_every_node() -> None:
    records = [rec("a", "n", 0, 0, 1), rec("b", "n", 0.5, 1.5, 3), rec("c", "m", 0, 0, 3)]
    c = conservation(records, window=(1.25, 3.0))
    assert c.idle_runnable_s == pytest.approx(0.25) and c.nodes == 2 and c.window_s == pytest.approx(1.75)
    assert c.idle_runnable_share == pytest.approx(0.25 / 3.5)
    assert c.idle_s == pytest.approx(0.25)


def test_quantiles_and_bound() -> None:
    records, t = [], 0.0
    for i, gap in enumerate([0.0] + [0.001] * 97 + [0.04, 0.3]):  # 99 handoffs, the last one 300 ms
        t += gap
        records.append(rec("a" if i % 2 else "b", "n", t - 0.5, t, t + 1, it=i))
        t += 1
    c = conservation(records)
    assert len(c.handoffs) == 99 and c.quantile_ms(0.5) == pytest.approx(1.0)
    assert [h.iteration for h in c.over(0.05)] == [99]
    assert work_json(c)["handoff_max_ms"] == pytest.approx(300.0)
    assert conservation([]).handoffs == () and conservation([]).quantile_ms(0.99) == 0.0
