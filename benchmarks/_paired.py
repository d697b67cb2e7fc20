"""Paired steps: a trainer's per-step overhead from two built jobs run one step at a time in turn.

Shared by ``benchmarks/roll_cpu.py`` and ``benchmarks/verl_cpu.py``. Both build the job with the
opt-in variable unset and the same job opted in once, then let one step of one job run at a time
(:func:`alternate`: the unset job first in even steps, the opted-in one first in odd ones), so the two
steps of a pair see the same machine load; each pair gives one ratio, and :class:`PairStats` gives
their median with a distribution-free interval. How a job is held between steps (a step gate in each
framework's CPU harness) and what a step's time is belongs to the benchmark.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

R = TypeVar("R")


class Named(Protocol):
    @property
    def name(self) -> str: ...


J = TypeVar("J", bound=Named)


def alternate(first: J, second: J, steps: int, *, release: Callable[[J, int], None],
              wait_step: Callable[[J, int], None], finish: Callable[[J], R]) -> dict[str, R]:
    """Run two step-gated jobs one step at a time: `first` then `second` in even steps, the other way
    round in odd ones (ABBA...); then let them finish, one after the other, in the same order.

    Args:
        first, second: the two jobs, each held before its step 0 and after each step.
        steps: steps per job (0-based ``k`` below).
        release: ``release(job, k)`` lets the job run its step k (k == steps: lets it run to its end).
        wait_step: ``wait_step(job, k)`` returns once the job has finished step k and is held again.
        finish: ``finish(job)`` waits for the released job's end and returns its result.

    Returns:
        Each job's ``finish`` result by job name.
    """
    out: dict[str, R] = {}
    for k in range(steps + 1):
        for job in (first, second) if k % 2 == 0 else (second, first):
            release(job, k)
            if k < steps:
                wait_step(job, k)
            else:
                out[job.name] = finish(job)
    return out


def renice(pids: Iterable[int]) -> int:
    """Put every process in `pids` at niceness 0, the driver's (Ray starts its workers at 15, which lets any
    other process on a shared box starve them mid-step). Done for both jobs alike, once built (during the
    build, workers at 0 starve the jobs' own raylets). Returns how many processes were changed."""
    n = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, pid) != 0:
                os.setpriority(os.PRIO_PROCESS, pid, 0)
                n += 1
    return n


def median_interval(xs: list[float], level: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free interval for the median of `xs` and its coverage: the order statistics
    (j, n+1-j) with the largest j whose binomial(n, 1/2) coverage is still >= `level` (the whole range,
    with its coverage, when n is too small)."""
    xs, n = sorted(xs), len(xs)

    def coverage(j: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n

    j = 1
    while j + 1 <= n // 2 and coverage(j + 1) >= level:
        j += 1
    return xs[j - 1], xs[n - j], coverage(j)


def pct(x: float) -> str:
    """A ratio as a signed percentage: ``+1.2 %``."""
    return f"{x * 100:+.1f} %"


@dataclass(frozen=True, slots=True, kw_only=True)
class PairStats:
    """The median of the pair values and their spread (ratios, 0.01 = 1 %)."""

    n: int  # pairs
    median: float
    q1: float  # first quartile
    q3: float  # third quartile
    low: float  # smallest pair value
    high: float  # largest pair value
    lo: float  # lower end of the median's interval (order statistics)
    hi: float  # upper end of the median's interval
    coverage: float  # the interval's coverage, >= 0.9 when there are enough pairs

    @classmethod
    def of(cls, values: list[float]) -> PairStats:
        if not values:
            raise ValueError("PairStats.of needs at least one pair value, got none")
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        lo, hi, cover = median_interval(values)
        return cls(n=len(values), median=statistics.median(values), q1=q[0], q3=q[2], low=min(values),
                   high=max(values), lo=lo, hi=hi, coverage=cover)

    def spread_line(self) -> str:
        """``spread of the pair values: quartiles ..., min ..., max ...; interval of the median ...``."""
        return (f"spread of the pair values: quartiles {pct(self.q1)} / {pct(self.q3)}, min {pct(self.low)}, max "
                f"{pct(self.high)}; interval of the median (order statistics, {self.coverage * 100:.0f} % coverage) "
                f"{pct(self.lo)} .. {pct(self.hi)}")
