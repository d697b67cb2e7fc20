"""Work conservation, from the shim's phase records: how long a node sat idle while a phase that may
run there was waiting for it.

A multiplexing scheduler exists to keep its pools busy, so the one thing it must never do is leave a
node idle while a job's next phase could run there. The records say exactly when that happened:
every owned phase record (``ROLLMUX_EVENT_LOG``; see :mod:`rollmux.demo.report`) names its node, when
its rank asked for the permit (``t_request``: the job's previous phase is over, so from then on the
phase is runnable there), when it had the permit in hand (``t_start``) and when it let go of the node
(``t_end``). A node is *busy* from a phase's ``t_start`` to its ``t_end`` and idle otherwise; a phase
is *waiting* from its ``t_request`` to its ``t_start``. Idle-while-runnable is the time both held.

Each idle stretch of a node during which some phase waited is one **handoff**: its cost is the part of
the stretch after the first waiting phase asked (the release, the grant and the permit's way back to
the rank, plus any wait for a turn). The demo's summary, ``benchmarks/multiplex_cpu.py`` and the
tests read this one module. Pure: records in, figures out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Handoff:
    """One idle stretch of a node while a phase waited for it."""

    node: str
    job: str  # the job whose phase ended the stretch (got the node next)
    phase: str
    iteration: int
    idle_from: float  # wall s: the node's previous phase let go of it (or the window opened)
    waited_from: float  # wall s: the first phase waiting for the node asked (>= idle_from)
    until: float  # wall s: the next phase had the permit in hand

    @property
    def idle_runnable_s(self) -> float:
        """Seconds the node was idle while a phase waited for it."""
        return max(0.0, self.until - self.waited_from)


@dataclass(frozen=True, slots=True, kw_only=True)
class Conservation:
    """Work conservation over a window, every node together."""

    window_s: float  # length of the window, s
    nodes: int  # nodes that ran a phase in it
    handoffs: tuple[Handoff, ...]  # every idle stretch with a waiting phase, in time order
    idle_s: float  # node-seconds idle in the window (with or without a waiting phase)

    @property
    def idle_runnable_s(self) -> float:
        """Node-seconds idle while a phase waited, in total."""
        return sum(h.idle_runnable_s for h in self.handoffs)

    @property
    def idle_runnable_share(self) -> float:
        """Idle-while-runnable as a share of the window's node-seconds (0 = work-conserving)."""
        total = self.window_s * self.nodes
        return self.idle_runnable_s / total if total > 0 else 0.0

    def quantile_ms(self, q: float) -> float:
        """The `q` quantile (0..1) of the handoffs' idle-while-runnable, in ms (0 without handoffs)."""
        vals = sorted(h.idle_runnable_s for h in self.handoffs)
        if not vals:
            return 0.0
        if len(vals) == 1:
            return vals[0] * 1e3
        return statistics.quantiles(vals, n=1000, method="inclusive")[min(998, max(0, round(q * 1000) - 1))] * 1e3

    def worst(self) -> Handoff | None:
        return max(self.handoffs, key=lambda h: h.idle_runnable_s, default=None)

    def over(self, bound_s: float) -> list[Handoff]:
        """Handoffs in which a node idled longer than `bound_s` while a phase waited for it."""
        return [h for h in self.handoffs if h.idle_runnable_s > bound_s]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Phase:
    node: str
    job: str
    phase: str
    iteration: int
    asked: float
    start: float
    end: float


def _owned(records: Iterable[dict[str, Any]]) -> list[_Phase]:
    return [_Phase(node=r["node"], job=r["job"], phase=r["phase"], iteration=int(r["iteration"]),
                   asked=float(r.get("t_request", r["t_start"])), start=float(r["t_start"]), end=float(r["t_end"]))
            for r in records if r.get("owner") and not r.get("lost")]


def conservation(records: Iterable[dict[str, Any]], window: tuple[float, float] | None = None) -> Conservation:
    """Idle-while-runnable and the handoffs of every node, within `window` (wall s; None: from the
    first phase's start to the last one's end).

    Args:
        records: phase records (``phases.jsonl``); follower and revoked records are ignored.
        window: the interval to measure (the demo uses its steady window: every job running).
    """
    phases = _owned(records)
    if not phases:
        return Conservation(window_s=0.0, nodes=0, handoffs=(), idle_s=0.0)
    lo, hi = window if window is not None else (min(p.start for p in phases), max(p.end for p in phases))
    by_node: dict[str, list[_Phase]] = defaultdict(list)
    for p in phases:
        by_node[p.node].append(p)
    handoffs: list[Handoff] = []
    idle = 0.0
    for node, ps in sorted(by_node.items()):
        ps.sort(key=lambda p: p.start)
        for h, gap in _node_handoffs(node, ps, lo, hi):
            idle += gap
            if h is not None:
                handoffs.append(h)
    handoffs.sort(key=lambda h: h.until)
    return Conservation(window_s=max(0.0, hi - lo), nodes=len(by_node), handoffs=tuple(handoffs), idle_s=idle)


def _node_handoffs(node: str, ps: Sequence[_Phase], lo: float, hi: float) -> Iterable[tuple[Handoff | None, float]]:
    """(handoff or None, idle seconds) for each idle stretch of one node inside [lo, hi]."""
    busy_until = lo
    for i, p in enumerate(ps):
        if p.end <= lo:
            busy_until = max(busy_until, p.end)
            continue
        if p.start >= hi:
            break
        a, b = max(busy_until, lo), min(p.start, hi)
        if b > a:
            # phases waiting for this node during [a, b): asked before b, not started by a
            asked = [q.asked for q in ps[i:] if q.asked < b and q.start >= b]
            first = min(asked, default=None)
            h = None
            if first is not None:
                h = Handoff(node=node, job=p.job, phase=p.phase, iteration=p.iteration, idle_from=a,
                            waited_from=max(a, first), until=b)
            yield h, b - a
        busy_until = max(busy_until, p.end)
    if hi > busy_until:
        yield None, hi - max(busy_until, lo)


def work_json(c: Conservation) -> dict[str, Any]:
    """The figures as summary.json and the benchmarks store them."""
    worst = c.worst()
    return {"idle_while_runnable_s": round(c.idle_runnable_s, 4),
            "idle_while_runnable_share": round(c.idle_runnable_share, 5), "handoffs": len(c.handoffs),
            "handoff_p50_ms": round(c.quantile_ms(0.5), 2), "handoff_p99_ms": round(c.quantile_ms(0.99), 2),
            "handoff_max_ms": round(worst.idle_runnable_s * 1e3, 2) if worst else 0.0}


def describe(c: Conservation) -> str:
    """One line for logs and benchmark output."""
    worst = c.worst()
    where = (f"; worst {worst.idle_runnable_s * 1e3:.0f} ms on {worst.node} before {worst.job} "
             f"{worst.phase}({worst.iteration})") if worst else ""
    return (f"idle while a phase waited: {c.idle_runnable_s:.2f} node-s = {c.idle_runnable_share:.1%} of "
            f"{c.window_s:.1f}s x {c.nodes} nodes; {len(c.handoffs)} handoffs, p50 {c.quantile_ms(0.5):.1f} ms, "
            f"p99 {c.quantile_ms(0.99):.1f} ms{where}")


__all__ = ["Conservation", "Handoff", "conservation", "describe", "work_json"]
