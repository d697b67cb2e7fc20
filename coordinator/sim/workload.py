"""Built-in workload generators: Philly arrivals with the paper's Table 6 phase profiles.

Arrival times and run lengths come from a segment of consecutive jobs of the Philly trace
(`data/philly_arrivals.csv`, see its README); each job's RL shape is drawn from Table 6:

    profile        S (8+8 GPUs, 7B)       M (16+16, 14B)          L (32+32, 32B)
    balanced       roll = train U(50,100)  U(100,200)              U(200,300)
    rollout-heavy  roll U(100,200)        U(200,400)              U(400,600)
                   train U(25,50)         U(50,100)               U(100,200)
    train-heavy    the mirror of rollout-heavy
    mixed          each job draws one of the nine (profile, size) pairs uniformly
    agentic        multi-turn (3-5 turns): rollout 3-4x training (paper §7.4's production mix),
                   training from the rollout-heavy ranges, max tokens per turn 4096

The last is not in Table 6: it stands for the agentic multi-turn jobs the paper's testbed trace
is made of, whose sequential turns make the rollout long and its straggler tail short.

The Philly duration becomes the number of iterations at the job's worst-case solo iteration
time. Resident state per node follows Table 2 for the size's model.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from importlib import resources

import numpy as np

from rollmux.coordinator.policy.profiler import state_bytes_per_node
from rollmux.coordinator.sim.api import TraceJob
from rollmux.core.errors import SpecError
from rollmux.core.model import GB


class Workload(str, Enum):
    BALANCED = "balanced"
    ROLLOUT_HEAVY = "rollout-heavy"
    TRAIN_HEAVY = "train-heavy"
    MIXED = "mixed"
    AGENTIC = "agentic"


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeClass:
    label: str  # S, M or L
    gpus: int  # N_R = N_T
    model: str  # model whose Table 2 state the job carries


SIZES = (SizeClass(label="S", gpus=8, model="7B"), SizeClass(label="M", gpus=16, model="14B"),
         SizeClass(label="L", gpus=32, model="32B"))

# profile -> per size (S, M, L): ((roll lo, hi), (train lo, hi)) seconds; paper Table 6
PROFILES: dict[Workload, tuple[tuple[tuple[float, float], tuple[float, float]], ...]] = {
    Workload.BALANCED: (((50, 100), (50, 100)), ((100, 200), (100, 200)), ((200, 300), (200, 300))),
    Workload.ROLLOUT_HEAVY: (((100, 200), (25, 50)), ((200, 400), (50, 100)), ((400, 600), (100, 200))),
    Workload.TRAIN_HEAVY: (((25, 50), (100, 200)), ((50, 100), (200, 400)), ((100, 200), (400, 600))),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SloSpec:
    """A fixed SLO (`1.2`) or a uniform draw per job (`U(1,2)`)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 1.0 <= self.low <= self.high:
            raise SpecError(f"slo=U({self.low},{self.high}) is invalid: expected 1 <= low <= high")

    @classmethod
    def parse(cls, text: str) -> SloSpec:
        """`1.5` or `U(1,2)` (case-insensitive, spaces allowed)."""
        s = text.strip().replace(" ", "")
        m = re.fullmatch(r"[uU]\(([0-9.]+),([0-9.]+)\)", s)
        try:
            if m:
                return cls(low=float(m.group(1)), high=float(m.group(2)))
            v = float(s)
        except ValueError:
            v = float("nan")
        if not v >= 1.0:
            raise SpecError(f"slo={text!r} is invalid: expected a number >= 1 (e.g. 1.2) or U(low,high) "
                            "with 1 <= low <= high (e.g. U(1,2))")
        return cls(low=v, high=v)

    def draw(self, rng: np.random.Generator) -> float:
        return self.low if self.low == self.high else float(rng.uniform(self.low, self.high))

    def __str__(self) -> str:
        return f"{self.low:g}" if self.low == self.high else f"U({self.low:g},{self.high:g})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    arrival_s: float
    duration_s: float


def load_arrivals() -> list[Arrival]:
    """The packaged Philly-derived arrivals, sorted by time."""
    text = resources.files("rollmux.coordinator.sim").joinpath("data/philly_arrivals.csv").read_text()
    rows = csv.DictReader(text.splitlines())
    return [Arrival(arrival_s=float(r["arrival_s"]), duration_s=float(r["duration_s"])) for r in rows]


def philly_segment(n_jobs: int, rng: np.random.Generator, arrivals: Sequence[Arrival] | None = None) -> list[Arrival]:
    """`n_jobs` consecutive arrivals from a random start, shifted to begin at t=0.

    Longer requests than the file holds wrap around (the file repeats after its own span).
    """
    pool = list(arrivals) if arrivals is not None else load_arrivals()
    if n_jobs < 1:
        raise SpecError(f"jobs={n_jobs} is invalid: expected an integer >= 1")
    span = pool[-1].arrival_s - pool[0].arrival_s + 3600.0
    start = int(rng.integers(0, max(1, len(pool) - n_jobs + 1))) if n_jobs < len(pool) else 0
    out = []
    for k in range(n_jobs):
        lap, idx = divmod(start + k, len(pool))
        a = pool[idx]
        out.append(Arrival(arrival_s=a.arrival_s + lap * span, duration_s=a.duration_s))
    t0 = out[0].arrival_s
    return [Arrival(arrival_s=a.arrival_s - t0, duration_s=a.duration_s) for a in out]


AGENTIC_TURNS = (3, 5)  # turns per job, inclusive
AGENTIC_ROLL_OVER_TRAIN = (3.0, 4.0)  # rollout / training time (paper §7.4: multi-turn rollouts 3-4x training)


def _shape(workload: Workload, rng: np.random.Generator) -> tuple[SizeClass, float, float, str]:
    if workload is Workload.AGENTIC:
        size_idx = int(rng.integers(0, 3))
        _, (t_lo, t_hi) = PROFILES[Workload.ROLLOUT_HEAVY][size_idx]
        t_train = float(rng.uniform(t_lo, t_hi))
        return SIZES[size_idx], t_train * float(rng.uniform(*AGENTIC_ROLL_OVER_TRAIN)), t_train, workload.value
    profile = workload
    if workload is Workload.MIXED:
        profile = (Workload.BALANCED, Workload.ROLLOUT_HEAVY, Workload.TRAIN_HEAVY)[int(rng.integers(0, 3))]
    size_idx = int(rng.integers(0, 3))
    (r_lo, r_hi), (t_lo, t_hi) = PROFILES[profile][size_idx]
    t_roll = float(rng.uniform(r_lo, r_hi))
    t_train = float(rng.uniform(t_lo, t_hi))  # balanced: an independent draw from the same range
    return SIZES[size_idx], t_roll, t_train, profile.value


def generate(workload: Workload | str, n_jobs: int = 300, seed: int = 0, slo: SloSpec | str = "U(1,2)",
             arrivals: Sequence[Arrival] | None = None) -> list[TraceJob]:
    """A seeded synthetic trace: Philly arrivals and lengths, Table 6 phase times, Table 2 state."""
    workload = Workload(workload)
    slo_spec = slo if isinstance(slo, SloSpec) else SloSpec.parse(slo)
    rng = np.random.default_rng(seed)
    segment = philly_segment(n_jobs, rng, arrivals)
    jobs = []
    for k, a in enumerate(segment):
        size, t_roll, t_train, _ = _shape(workload, rng)
        agentic = workload is Workload.AGENTIC
        turns = int(rng.integers(AGENTIC_TURNS[0], AGENTIC_TURNS[1] + 1)) if agentic else 1
        params_b = float(size.model.rstrip("B"))
        roll_b, train_b = state_bytes_per_node(params_b)
        jobs.append(TraceJob(
            job_id=f"job{k:04d}", arrival_s=round(a.arrival_s), iterations=max(1, round(a.duration_s / (t_roll + t_train))),
            t_roll_s=round(t_roll, 3), t_train_s=round(t_train, 3), n_rollout_gpus=size.gpus, n_train_gpus=size.gpus,
            slo=round(slo_spec.draw(rng), 4), rollout_state_gb=round(roll_b / GB, 1),
            train_state_gb=round(train_b / GB, 1), model=size.model, max_tokens=4096 if agentic else 8192, turns=turns))
    return jobs
