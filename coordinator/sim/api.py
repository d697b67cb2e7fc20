"""Contracts of the trace simulator: trace rows, per-policy results, the strategy protocol, errors.

The simulator replays a job trace in virtual time. Every policy, whether it places jobs into
co-execution groups (RollMux, Random, Most-Idle, Solo-D, Opt) or gives each job its own fixed
allocation (Colocate, Gavel+), runs behind the same `SimStrategy` protocol and returns the same
`PolicyRun`, so all of them can be compared side by side on one trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rollmux.coordinator.policy.intra_group import PhaseInterval
from rollmux.core.errors import RollMuxError, SpecError

if TYPE_CHECKING:
    from rollmux.coordinator.policy.api import PolicyConfig
    from rollmux.coordinator.sim.runtime import JobDraws, RuntimeConfig
    from rollmux.core.model import ClusterSpec, JobSpec


class SimError(RollMuxError):
    """The simulation cannot run as asked (e.g. Opt on a trace that is too large)."""


class TraceError(SpecError):
    """A trace file is malformed; the message names file:line, the field and the allowed range."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One row of a trace: a job, when it arrives and how long it runs."""

    job_id: str  # unique name
    arrival_s: float  # submit time, seconds from the trace start
    iterations: int  # RL iterations to run (the job ends after the last Train)
    t_roll_s: float  # worst-case solo rollout time on its own N_R GPUs, s
    t_train_s: float  # worst-case solo train time (sync included) on its own N_T GPUs, s
    n_rollout_gpus: int  # N_R
    n_train_gpus: int  # N_T
    slo: float  # max slowdown vs solo, >= 1
    rollout_state_gb: float  # resident host state per 8-GPU rollout node, GB
    train_state_gb: float  # resident host state per 8-GPU training node, GB
    model: str = ""  # model label, e.g. "7B" (sizes the weight sync and cold starts)
    max_tokens: int = 8192  # max response tokens per turn
    turns: int = 1  # 1 = single turn; > 1 = multi-turn
    elastic: bool = False  # its Train may stretch over a pooled training pool (`JobSpec.elastic`)

    @property
    def model_params_b(self) -> float:
        """Parameters in billions parsed from `model` ("Qwen-2.5-14B" -> 14); 7 when unknown."""
        digits = ""
        for ch in reversed(self.model.upper().rstrip("B")):
            if ch.isdigit() or ch == ".":
                digits = ch + digits
            else:
                break
        try:
            return float(digits) if digits else 7.0
        except ValueError:
            return 7.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePoint:
    """The cluster after an event: what is provisioned from `t_s` until the next point."""

    t_s: float
    usd_per_h: float
    rollout_gpus: int
    train_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOutcome:
    """How one job fared under a policy."""

    job_id: str
    arrival_s: float
    finish_s: float
    iterations: int
    mean_iteration_s: float  # (finish - arrival) / iterations
    solo_iteration_s: float  # mean iteration alone on its own disaggregated GPUs, same draws
    planned_solo_s: float  # worst-case T_solo the policy planned with (T_roll + T_train)
    slo: float
    group_id: str  # where it ran ("" for dedicated allocations)

    @property
    def slowdown(self) -> float:
        return self.mean_iteration_s / self.solo_iteration_s

    @property
    def slo_met(self) -> bool:
        """Mean iteration within SLO x the job's realised solo iteration (what its owner sees)."""
        return self.slowdown <= self.slo * (1 + 1e-6)

    @property
    def planned_slo_met(self) -> bool:
        """Mean iteration within SLO x worst-case T_solo (the paper's definition, what planning guarantees)."""
        return self.mean_iteration_s <= self.slo * self.planned_solo_s * (1 + 1e-6)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRun:
    """Everything one policy produced on one trace (metrics are derived from it)."""

    policy: str
    timeline: tuple[TimelinePoint, ...]  # provisioned cost and GPUs, piecewise constant
    jobs: tuple[JobOutcome, ...]
    busy_gpu_s: dict[str, float]  # pool -> GPU-seconds spent running phases
    intervals: dict[str, tuple[PhaseInterval, ...]] = field(default_factory=dict)  # group -> phases (recorded)
    wall_s: float = 0.0  # real seconds the simulation took
    relocations: int = 0  # jobs moved between groups while running (RollMux regrouping)


ProgressFn = Callable[[int], None]
"""Called with the number of events just processed (drives a progress bar)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimContext:
    """What every strategy needs besides the jobs: cluster shape, runtime model, per-job draws."""

    cluster: ClusterSpec
    runtime: RuntimeConfig
    draws: dict[str, JobDraws]  # job id -> per-iteration phase times (shared by all policies)
    max_group_size: int = 5
    seed: int = 0
    record_intervals: bool = True
    policy_config: PolicyConfig | None = None  # RollMux's knobs (default: PolicyConfig(max_group_size=...))


class SimStrategy(Protocol):
    """One policy as the simulator runs it."""

    name: str

    def simulate(self, trace: Sequence[TraceJob], specs: dict[str, JobSpec], ctx: SimContext,
                 progress: ProgressFn | None = None) -> PolicyRun: ...
