"""Pure checks over a chaos run's event log (no I/O): what the jobs saw, against what must hold.

Events are the JSON lines of :mod:`rollmux.testing.chaos.rank` (``start``, ``end``, ``lost``,
``released``, ``done``) plus the harness's own: ``killed`` (it SIGKILLed process ``pid`` of
``run``: an open phase of that process ends there) and ``fault`` (``kind``, ``t``, ``ready_t``:
when the faulty part served again, ``nodes``: the nodes it took away, if any).

* Mutual exclusion: per node, the phases (start .. end, lost or killed) of two different runs
  never overlap.
* On-policy order: a run's released phases, ordered by their grant epoch (cluster-wide
  increasing), are Rollout(0), Train(0), Sync(0), Rollout(1), ... with nothing missing (lost) and
  nothing twice (repeated); a completed run released all of them, an aborted one a prefix. A phase
  whose process was killed while releasing it may have been released unrecorded: not counted lost.
* Recovery: from each fault to the first phase granted after the faulty part served again (on the
  fault's nodes when it names some; a fault on nodes no job was placed on is counted as idle).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollmux.core.model import PHASE_ORDER


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """One phase held on one node."""

    start: float
    end: float
    run: str
    epoch: int
    closed: bool = True  # False: no end, lost or killed record (the process vanished unrecorded)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCheck:
    """One run's released phases against the on-policy order."""

    run: str
    completed: bool
    released: int
    lost: tuple[tuple[str, int], ...]
    repeated: tuple[tuple[str, int], ...]
    out_of_order: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Everything a chaos run is judged by."""

    phases_completed: int
    violations: tuple[str, ...]  # mutual-exclusion violations, one line each
    unclosed: int  # phases whose end was never recorded
    unconfirmed: int = 0  # phases whose process was killed while releasing them (not judged lost)
    runs: tuple[RunCheck, ...]
    faults: Counter[str] = field(default_factory=Counter)
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    unrecovered: Counter[str] = field(default_factory=Counter)  # not recovered within the limit
    idle: Counter[str] = field(default_factory=Counter)  # struck nodes no job was placed on

    @property
    def lost(self) -> int:
        return sum(len(r.lost) for r in self.runs)

    @property
    def repeated(self) -> int:
        return sum(len(r.repeated) for r in self.runs)

    @property
    def out_of_order(self) -> int:
        return sum(r.out_of_order for r in self.runs)

    @property
    def clean(self) -> bool:
        return not (self.violations or self.lost or self.repeated or self.out_of_order or self.unclosed)


def intervals(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Interval]]:
    """Per node, the phases held on it (an unrecorded end is taken as the last event's time)."""
    open_: dict[tuple[str, int, int], tuple[float, tuple[str, ...]]] = {}
    out: dict[str, list[Interval]] = defaultdict(list)
    last_t = 0.0

    def close(key: tuple[str, int, int], t: float, closed: bool = True) -> None:
        start, nodes = open_.pop(key)
        for n in nodes:
            out[n].append(Interval(start=start, end=t, run=key[0], epoch=key[2], closed=closed))

    for ev in events:
        t, kind = float(ev["t"]), ev["ev"]
        last_t = max(last_t, t)
        if kind == "start":
            open_[(ev["run"], ev["pid"], ev["epoch"])] = (t, tuple(ev["nodes"]))
        elif kind in ("end", "lost"):
            key = (ev["run"], ev["pid"], ev["epoch"])
            if key in open_:
                close(key, t)
        elif kind == "killed":
            for key in [k for k in open_ if k[0] == ev["run"] and k[1] == ev["pid"]]:
                close(key, t)
    for key in list(open_):
        close(key, last_t, closed=False)
    return dict(out)


def exclusion_violations(per_node: Mapping[str, Sequence[Interval]]) -> list[str]:
    """Each time a run started on a node while another run still held it."""
    found = []
    for node, ivs in sorted(per_node.items()):
        holder: Interval | None = None
        for iv in sorted(ivs, key=lambda i: i.start):
            if holder is not None and iv.start < holder.end and iv.run != holder.run:
                found.append(f"{node}: {iv.run} (epoch {iv.epoch}) started at {iv.start:.6f} while {holder.run} "
                             f"(epoch {holder.epoch}) held it until {holder.end:.6f}")
            if holder is None or iv.end > holder.end:
                holder = iv
    return found


def check_run(run: str, released: Sequence[tuple[int, str, int]], *, iterations: int, completed: bool,
              unconfirmed: frozenset[tuple[str, int]] = frozenset()) -> RunCheck:
    """`released`: (epoch, phase, iteration) of each acknowledged release of the run; `unconfirmed`:
    phases whose process was killed while releasing (the release may have landed unrecorded)."""
    expected = [(ph.value, i) for i in range(iterations) for ph in PHASE_ORDER]
    by_epoch = [(ph, it) for _, ph, it in sorted(released)]
    counts = Counter(by_epoch)
    repeated = tuple(sorted((k for k, c in counts.items() if c > 1), key=expected.index))
    reach = len(expected) if completed else max((expected.index(k) + 1 for k in counts), default=0)
    lost = tuple(k for k in expected[:reach] if k not in counts and k not in unconfirmed)
    unique = list(dict.fromkeys(by_epoch))
    return RunCheck(run=run, completed=completed, released=len(by_epoch), lost=lost, repeated=repeated,
                    out_of_order=unique != [k for k in expected if k in counts])


def recovery(faults: Sequence[Mapping[str, Any]], starts: Sequence[Mapping[str, Any]],
             limit_s: float) -> tuple[dict[str, list[float]], Counter[str]]:
    """Per fault kind, seconds from the fault to the first grant after it served again."""
    times: dict[str, list[float]] = defaultdict(list)
    missed: Counter[str] = Counter()
    ordered = sorted(starts, key=lambda e: e["t"])
    for f in faults:
        if f.get("idle"):
            continue  # nothing ran on its nodes: nothing to recover
        if f.get("failed"):
            missed[f["kind"]] += 1  # the faulty part never served again (for example no standby took over)
            continue
        after = max(float(f["t"]), float(f.get("ready_t") or f["t"]))
        nodes = set(f.get("nodes") or ())
        first = next((e["t"] for e in ordered if e["t"] > after and (not nodes or nodes & set(e["nodes"]))), None)
        if first is None or first - f["t"] > limit_s:
            missed[f["kind"]] += 1
        else:
            times[f["kind"]].append(first - float(f["t"]))
    return dict(times), missed


def _killed_releasing(events: Sequence[Mapping[str, Any]],
                      faults: Sequence[Mapping[str, Any]]) -> dict[str, frozenset[tuple[str, int]]]:
    """Per run, the phases a rank kill struck after the body ended (the release was in flight)."""
    struck = {(f["run"], f["epoch"]) for f in faults if f.get("in_release")}
    out: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for ev in events:
        if ev["ev"] == "start" and (ev["run"], ev["epoch"]) in struck:
            out[ev["run"]].add((ev["phase"], ev["it"]))
    return {r: frozenset(v) for r, v in out.items()}


def judge(events: Sequence[Mapping[str, Any]], outcomes: Mapping[str, bool], *, iterations: int,
          recovery_limit_s: float = 120.0) -> Verdict:
    """The verdict over all events; `outcomes`: run -> completed (True) or aborted by a fault (False)."""
    per_node = intervals(events)
    released: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for ev in events:
        if ev["ev"] == "released":
            released[ev["run"]].append((ev["epoch"], ev["phase"], ev["it"]))
    faults = [ev for ev in events if ev["ev"] == "fault"]
    unconfirmed = _killed_releasing(events, faults)
    runs = tuple(check_run(r, released.get(r, []), iterations=iterations, completed=done,
                           unconfirmed=unconfirmed.get(r, frozenset()))
                 for r, done in sorted(outcomes.items()))
    times, missed = recovery(faults, [ev for ev in events if ev["ev"] == "start"], recovery_limit_s)
    return Verdict(phases_completed=sum(len(v) for v in released.values()),
                   violations=tuple(exclusion_violations(per_node)),
                   unclosed=sum(not iv.closed for ivs in per_node.values() for iv in ivs),
                   unconfirmed=sum(len(v) for v in unconfirmed.values()),
                   runs=runs, faults=Counter(f["kind"] for f in faults), recovery_s=times, unrecovered=missed,
                   idle=Counter(f["kind"] for f in faults if f.get("idle")))


def table(v: Verdict) -> str:
    """The verdict as a plain-text report."""
    lines = ["fault kind           injected  idle  recovered  recovery p50 s  max s"]
    for kind in sorted(v.faults):
        ts = v.recovery_s.get(kind, [])
        p50 = f"{statistics.median(ts):.2f}" if ts else "-"
        mx = f"{max(ts):.2f}" if ts else "-"
        lines.append(f"{kind:<20} {v.faults[kind]:>8}  {v.idle[kind]:>4}  {len(ts):>9}  {p50:>14}  {mx:>5}")
    done = sum(r.completed for r in v.runs)
    lines += [f"faults injected: {sum(v.faults.values())}",
              f"phases completed: {v.phases_completed} (runs: {done} completed, {len(v.runs) - done} aborted by a fault)",
              f"mutual-exclusion violations: {len(v.violations)}",
              f"lost phases: {v.lost}, repeated phases: {v.repeated}, runs out of order: {v.out_of_order}, "
              f"phases with no recorded end: {v.unclosed}, killed while releasing (not judged): {v.unconfirmed}"]
    lines += [f"  violation: {x}" for x in v.violations[:10]]
    lines += [f"  {r.run}: lost {list(r.lost)} repeated {list(r.repeated)} out of order {r.out_of_order}"
              for r in v.runs if r.lost or r.repeated or r.out_of_order][:10]
    return "\n".join(lines)
