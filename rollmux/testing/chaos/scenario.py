"""One chaos run: start the deployment, keep the job slots running, inject seeded faults for a
window, let the last runs finish, then judge the event log (:func:`rollmux.testing.chaos.ledger.judge`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollmux.testing.chaos import ledger
from rollmux.testing.chaos.deployment import Deployment, Topology
from rollmux.testing.chaos.faults import FaultKind, Injector
from rollmux.testing.chaos.jobs import EventTail, Jobs


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    """What to run and for how long."""

    seed: int = 1
    window_s: float = 60.0  # faults are injected during this window; then the last runs finish
    drain_s: float = 180.0  # the longest the last runs may take after the window
    shim_jobs: int = 3  # slots whose jobs run as shim ranks through the sidecars
    direct_jobs: int = 1  # slots whose jobs talk to the coordinator themselves
    iterations: int = 6  # per run
    phase_s: float = 0.1  # how long each phase body sleeps
    gap_s: tuple[float, float] = (2.0, 5.0)  # pause between two faults (seeded uniform)
    settle_s: float = 15.0  # new runs keep starting this long after the last fault's part served again
    kinds: tuple[FaultKind, ...] = tuple(FaultKind)
    max_faults: int | None = None  # stop injecting after this many (None: until the window closes)
    topology: Topology = field(default_factory=Topology)

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.drain_s <= 0 or self.settle_s < 0:
            raise ValueError(f"window_s={self.window_s} and drain_s={self.drain_s} must be > 0, "
                             f"settle_s={self.settle_s} >= 0")
        if self.shim_jobs < 0 or self.direct_jobs < 0 or self.shim_jobs + self.direct_jobs == 0:
            raise ValueError("need at least one job slot (shim_jobs + direct_jobs >= 1)")
        if self.iterations < 1 or self.phase_s < 0:
            raise ValueError(f"iterations={self.iterations} must be >= 1 and phase_s={self.phase_s} >= 0")
        if not (0 <= self.gap_s[0] <= self.gap_s[1]):
            raise ValueError(f"gap_s={self.gap_s} must be (min, max) with 0 <= min <= max")
        if not self.kinds:
            raise ValueError("kinds must name at least one fault kind")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosResult:
    verdict: ledger.Verdict
    unfinished: tuple[str, ...]  # slots whose last run had not completed by the end of the drain
    injector_errors: tuple[str, ...]  # faults that could not be injected
    window_s: float  # the fault window as it ran
    wall_s: float  # the whole run, start-up to teardown
    log: Path


def run_chaos(config: ChaosConfig, workdir: Path, *, progress: Callable[[str], None] | None = None) -> ChaosResult:
    """Run the scenario in `workdir` (logs, event log) and judge it."""
    say = progress or (lambda _msg: None)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "events.jsonl"
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    deploy = Deployment(workdir, config.topology).start()
    say(f"deployment up in {time.monotonic() - t0:.1f}s: redis, {len(deploy.coordinators)} coordinators, "
        f"{len(deploy.sidecars)} sidecars")
    jobs = Jobs(deploy, log, shim=config.shim_jobs, direct=config.direct_jobs, iterations=config.iterations,
                phase_s=config.phase_s)
    tail = EventTail(log)
    injector = Injector(deploy, jobs, tail, seed=config.seed, kinds=config.kinds, gap_s=config.gap_s,
                        max_faults=config.max_faults)
    try:
        window = _drive(config, jobs, tail, injector, say)
    finally:
        injector.stop()
        jobs.stop()
        deploy.stop()
    tail.poll()
    verdict = ledger.judge(tail.snapshot(), jobs.outcomes(), iterations=config.iterations)
    return ChaosResult(verdict=verdict, unfinished=tuple(jobs.unfinished()), injector_errors=tuple(injector.errors),
                       window_s=window, wall_s=time.monotonic() - t0, log=log)


def _settled_at(events: list[dict[str, Any]], settle_s: float) -> float:
    """Wall time until which new runs keep starting: `settle_s` after the last fault's part served
    again. A fault late in the window is judged by the grants on its nodes after it, and once no run
    starts, none may come (the runs it aborted are placed while its node is still down)."""
    last = max((float(e.get("ready_t") or e["t"]) for e in events if e["ev"] == "fault"), default=0.0)
    return last + settle_s


def _drive(config: ChaosConfig, jobs: Jobs, tail: EventTail, injector: Injector, say: Callable[[str], None]) -> float:
    """Supervise the slots through the fault window and the drain; returns the window's length."""
    start = time.monotonic()
    window_end = start + config.window_s
    injector.start()
    next_note, closed_at = start + 10, 0.0
    settle_until: float | None = None  # wall time until which runs keep starting once faults stopped
    while True:
        now = time.monotonic()
        open_ = now < window_end and not (config.max_faults is not None and injector.injected >= config.max_faults
                                          and not injector.thread.is_alive())
        if not open_ and not closed_at:
            closed_at = now
            injector.stopped.set()
            say(f"fault window closed after {now - start:.0f}s ({injector.injected} faults); runs start for "
                f"{config.settle_s:g}s more after the last fault's part served again, then finish")
        tail.poll()
        if closed_at and (settle_until is None or injector.thread.is_alive()):  # a last fault may still finish
            settle_until = _settled_at(tail.snapshot(), config.settle_s)
        jobs.step(open_=open_ or (settle_until is not None and time.time() < settle_until))
        if closed_at and jobs.finished():
            return closed_at - start
        if closed_at and now > closed_at + config.drain_s:
            say(f"drain limit {config.drain_s:g}s reached; unfinished slots: {jobs.unfinished()}; "
                f"cluster state in {jobs.dump_state()}")
            return closed_at - start
        if now > next_note:
            released = sum(e["ev"] == "released" for e in tail.snapshot())
            say(f"{now - start:5.0f}s: {injector.injected} faults, {released} phases released")
            next_note = now + 10
        time.sleep(0.05)
