"""Contracts of the scheduling policy: config, decisions, rejections, the policy protocol.

Policies are pure: they read a `ClusterState` snapshot and a job and return a
`PlacementDecision`; they never touch a clock, Redis, gRPC or unseeded randomness. Rejections are
values carrying a reason code and a message, so an operator can ask why a job went where it went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from rollmux.core.errors import RollMuxError, SpecError
from rollmux.core.model import Deployment, JobSpec, Pool

if TYPE_CHECKING:
    from rollmux.coordinator.policy.state import ClusterState


class PolicyError(RollMuxError):
    """The policy was called with inputs it cannot work on (a bug in the caller)."""


class UnknownPolicyError(PolicyError, KeyError):
    """A policy name that is not registered."""


class Strategy(str, Enum):
    """How a job is placed (paper Fig. 5)."""

    DIRECT_PACKING = "direct-packing"  # existing rollout nodes only; delta cost 0
    ROLLOUT_SCALING = "rollout-scaling"  # some new rollout nodes
    TRAIN_SCALING = "train-scaling"  # existing rollout nodes; the job brings its own new training nodes
    ISOLATED = "isolated"  # a new group with the job's own N_R + N_T GPUs


class RejectReason(str, Enum):
    """Why a candidate group or placement was not taken."""

    SATURATED = "saturated"  # T_load >= T_cycle already (Algorithm 1, line 4)
    GROUP_FULL = "group-full"  # max group size reached
    TRAIN_POOL = "train-pool"  # the job needs more training GPUs than the group's pool has
    HOST_DRAM = "host-dram"  # resident state would not fit a node's host DRAM
    SLO = "slo"  # simulated co-execution would break a member's SLO
    NOT_EVALUATED = "not-evaluated"  # an earlier group already offered a zero-cost placement
    NODE_UNAVAILABLE = "node-unavailable"  # a node the placement needs is draining, drained or lost
    OCCUPANCY = "occupancy"  # the join's slowdown of the group costs more $ per unit of work than going alone


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    group_id: str
    strategy: Strategy | None  # None when the whole group was pruned
    reason: RejectReason
    message: str

    def __str__(self) -> str:
        how = f" ({self.strategy.value})" if self.strategy else ""
        return f"{self.group_id}{how}: {self.reason.value}: {self.message}"


LIVE_MERGE_CANDIDATES = 16
"""Other lone jobs one merge search of the live coordinator prices exactly (`PolicyConfig.merge_candidates`):
~3 ms at 0.2 ms each, where all 2,000 lone groups took ~400 ms of the event loop."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """Knobs of the placement policy."""

    max_group_size: int = 5  # most jobs one group may hold (host-memory residency in the simulator)
    slo_tolerance: float = 1e-9  # relative slack when comparing T_coexec with SLO * T_solo
    # Also consider saturated groups (T_load >= T_cycle), accepting a placement only when the
    # exact co-execution period still meets every member's SLO. Algorithm 1 prunes them (set
    # False for the paper's behaviour); packing them is cheaper at no SLO risk: 1.07x vs 1.10x of
    # the offline optimum on 8-job instances (benchmarks/optimality_gap.py), and the decision stays
    # fast because a whole-group lower bound rejects most saturated groups without simulating.
    fill_saturated: bool = True
    # Per-job deployment mode (docs/design/policy.md): also consider co-locating a job on training-pool
    # GPUs (alone, or time-sharing a group's training pool) and on rollout-pool GPUs, and take the
    # cheapest feasible. False: every job is a disaggregated group member (the paper's policy).
    modes: bool = True
    # Learned phase times: plan members with a high percentile of their measured iterations once
    # `learn_min_samples` are seen (window `learn_window`), and judge SLOs against their measured
    # solo iteration. False: worst-case times for the job's whole life.
    learn: bool = True
    learn_min_samples: int = 3  # samples before a learned time replaces the profile (docs/design/policy.md)
    learn_window: int = 20
    learn_quantile: float = 0.9
    # Regrouping: on departures and on SLO risk, relocate members (at iteration boundaries) where
    # the $ saved over their remaining run exceeds what the move costs; release freed nodes.
    regroup: bool = True
    restart_s: float = 60.0  # relocation: stop, restart the actors on other nodes (paper Fig. 4 cold start)
    checkpoint_gb_s: float = 2.5  # relocation: checkpoint + reload bandwidth per node (20 Gbps storage), GB/s
    regroup_payback: float = 3.0  # a move must save this many times its own cost
    # Relocations one job may take over its life (each is charged its downtime). With 4 the moves the
    # regroup plan finds worth their cost are taken late
    # in a job's life too (docs/design/policy.md has the figure).
    max_moves_per_job: int = 4
    # Best move: among a job's single move, pair merge and pool merge take the one saving the most $
    # over the jobs' remaining run. False: the first of the three (in that order) that pays. Off in
    # `PolicyConfig()`; `rollmux simulate`, the benchmarks (`--no-best-move` there) and the live
    # coordinator (`PolicyConfig.live`: merges are one directive per moving job) turn it on.
    best_move: bool = False
    # Pool merge (regrouping): two lone jobs share one disaggregated group on both their training
    # nodes (no node bought), Trains stretched over the pooled nodes, Rollouts on the rollout pool;
    # a group whose training pool exceeds every member's need takes no newcomer (it would keep the
    # pool alive). False: pairs share the larger job's training nodes only.
    pool_merge: bool = True
    # Train scaling: a job joins a group on its rollout nodes bringing its own new training nodes
    # (+ their $/h; its Train runs there, beside the members' on theirs: per-node queues), which
    # saves its rollout nodes over a new group. Why: a fixed-world-size job trains on exactly its
    # own GPUs, so sharing the rollout pool is what is left to share when its Train cannot queue
    # behind the members'. False (the default): Algorithm 1's rule, the training pool is never grown
    # by a join. Off because it measured worse: headline Solo-D / RollMux 1.583x off, 1.578x on (a
    # join at +1 training node takes the place of a new group that later jobs would have shared).
    train_scaling: bool = False
    # Co-execution margin: a join is feasible when the fixed-time period is within every member's
    # budget / (1 + margin). Per-iteration times vary, so the realised period of a shared schedule
    # runs above the fixed-time (max-plus) one; without it jobs admitted at exactly their budget
    # missed their SLO against their realised solo iteration (agentic U(1.1,1.3) seed 2: 97.5%).
    # 2.5% since Trains run on per-node queues (members on disjoint training nodes side by side, so
    # fewer phases absorb another's spread): at 2% balanced U(1,2) seed 1 realised 99.0%, at 2.5% 99.5%.
    coexec_margin: float = 0.025
    # The margin for a join that makes a group of 4 or more members (`placement.BIG_GROUP`): with
    # 2% a 4-member agentic group ran 4.5% over its fixed-time period and a member missed its
    # realised SLO (agentic U(1.1,1.3) seed 2, docs/design/policy.md). Equal to coexec_margin: no wider margin.
    coexec_margin_big: float = 0.04
    # Work-aware joins: take the cheapest join only when the group with the job costs no more $ per
    # unit of work (solo-seconds per second) than the group as it is plus the job alone in its
    # cheapest new group; a +$0/h join that stretches the group's period makes every member hold
    # its nodes longer. False: the cheapest join in $/h always wins over a new group. Off in
    # `PolicyConfig()` (it assumes the lone group's nodes can be bought); `rollmux simulate`, the
    # benchmarks (`--no-work-aware` there) and the live coordinator turn it on, the latter falling
    # back to the join when its fixed fleet has no free nodes for the job alone (`runtime.admission`).
    work_aware: bool = False
    # Joins into pooled training pools: a group whose training pool is larger than every member needs
    # (a pool merge's, or one a big job left) takes newcomers, which the work-aware check guards.
    # False (or without work_aware): such a group takes no newcomer (rejection `train-pool`).
    pooled_joins: bool = True
    # Pool-merge survivor's return (simulator): a job left alone in a pooled training pool (its
    # partner ended) may take one relocation beyond the per-job cap, the one the pool merge priced in.
    pool_return: bool = True
    # Regroup on learning: when members' phase times become learned (their plan changes), look for
    # moves for the group's members, as after a departure. False: only arrivals and departures.
    regroup_on_learn: bool = True
    # Merge candidates: the most other lone jobs one pair- or pool-merge search prices exactly
    # (`regroup._pair_cost`), in group order; None: every one. The live coordinator bounds it: at
    # 2,000 lone groups one pool-merge search took ~400 ms of its event loop (every call in flight
    # waited), ~0.2 ms per candidate. The simulator keeps None (its figures are unchanged).
    merge_candidates: int | None = None
    # Admission lookahead (`policy.admission.place_pending`): with other jobs pending behind the one
    # being admitted, compare its choices (its cheapest, its other new groups, its joins) by what the
    # cluster costs once the next `lookahead_jobs` pending jobs are placed too; 0: place it alone.
    lookahead_jobs: int = 8
    # Pull moves (regrouping): when a group's plan changes (a member left, arrived, or its times were
    # learned), a job alone in another group may join it, releasing its own group. False: a lone job
    # moves only at its own events.
    pull_moves: bool = True

    # ------------------------------------------------------------------------------- presets
    # The three sets of knobs the project runs, each defined here once; `PolicyConfig()` is the base
    # they change. A caller switches a mechanism off by passing it: `PolicyConfig.live(regroup=False)`.

    @classmethod
    def paper(cls, **changes: Any) -> PolicyConfig:
        """The paper's Algorithm 1 alone (the simulator's ``rollmux-alg1``): every job a disaggregated
        group member, worst-case phase times, no regrouping."""
        return cls(**{"modes": False, "learn": False, "regroup": False, **changes})

    @classmethod
    def simulator(cls, **changes: Any) -> PolicyConfig:
        """What `rollmux simulate` and the benchmarks run: every mechanism on, work-aware joins and best
        moves included (`PolicyConfig()` keeps those two off)."""
        return cls(**{"work_aware": True, "best_move": True, **changes})

    @classmethod
    def live(cls, **changes: Any) -> PolicyConfig:
        """What a live coordinator runs: the simulator's knobs, but deployment modes are opt-in (the
        fleet's two pools expect disaggregated groups) and a merge search prices at most
        `LIVE_MERGE_CANDIDATES` other lone jobs (the simulator prices all). Work-aware admission falls
        back to the join where the fixed fleet has no free nodes for the job alone
        (`runtime.admission`); a merge becomes one directive per moving job (`runtime.relocation`)."""
        return cls(**{"modes": False, "work_aware": True, "best_move": True,
                      "merge_candidates": LIVE_MERGE_CANDIDATES, **changes})

    def __post_init__(self) -> None:
        if self.merge_candidates is not None and (not isinstance(self.merge_candidates, int) or self.merge_candidates < 1):
            raise SpecError(f"merge_candidates={self.merge_candidates!r} is invalid: expected an integer >= 1 or None (all)")
        if not isinstance(self.lookahead_jobs, int) or self.lookahead_jobs < 0:
            raise SpecError(f"lookahead_jobs={self.lookahead_jobs!r} is invalid: expected an integer >= 0")
        if not isinstance(self.max_group_size, int) or self.max_group_size < 1:
            raise SpecError(f"max_group_size={self.max_group_size!r} is invalid: expected an integer >= 1")
        if not isinstance(self.learn_min_samples, int) or not 1 <= self.learn_min_samples <= self.learn_window:
            raise SpecError(f"learn_min_samples={self.learn_min_samples!r} is invalid: expected an integer in "
                            f"[1, learn_window={self.learn_window}]")
        if not 0.5 <= self.learn_quantile <= 1.0:
            raise SpecError(f"learn_quantile={self.learn_quantile!r} is invalid: expected 0.5 <= q <= 1")
        if not isinstance(self.max_moves_per_job, int) or self.max_moves_per_job < 0:
            raise SpecError(f"max_moves_per_job={self.max_moves_per_job!r} is invalid: expected an integer >= 0")
        for name in ("coexec_margin", "coexec_margin_big"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise SpecError(f"{name}={getattr(self, name)!r} is invalid: expected 0 <= margin < 1")
        for name in ("restart_s", "checkpoint_gb_s", "regroup_payback"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and (name != "checkpoint_gb_s" or v > 0)):
                raise SpecError(f"{name}={v!r} is invalid: expected a number >= 0 (> 0 for a bandwidth)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementDecision:
    """Where a job goes, at what marginal cost, and why every other candidate lost."""

    job: str
    strategy: Strategy
    group_id: str | None  # target group; None = a new isolated group
    rollout_nodes: tuple[str, ...]  # existing rollout node ids the job is pinned to
    new_rollout_nodes: int  # rollout nodes to provision and pin the job to as well
    new_train_nodes: int  # training nodes to provision: a new group's, or those a train-scaling join brings
    delta_usd_per_h: float  # marginal cost: Cost(G') - Cost(G)
    t_coexec_s: dict[str, float] = field(default_factory=dict)  # member -> predicted period after placement
    rejections: tuple[Rejection, ...] = ()
    deployment: Deployment = Deployment.DISAGGREGATED  # how the job's phases are laid out (returned at registration)
    train_pool: Pool = Pool.TRAIN  # pool of a new group's training nodes (ROLLOUT: co-located on rollout GPUs)
    reason: str = ""  # why this mode and place: the alternatives' $/h and why they lost

    def explain(self) -> str:
        """One line per candidate: the choice first, then each rejection."""
        where = self.group_id or "new group"
        lines = [f"{self.job} -> {where} by {self.strategy.value} ({self.deployment.value}): "
                 f"+${self.delta_usd_per_h:,.2f}/h "
                 f"(pins {len(self.rollout_nodes)} existing + {self.new_rollout_nodes} new rollout nodes"
                 + (f", {self.new_train_nodes} new training nodes)" if self.new_train_nodes else ")")]
        if self.reason:
            lines.append(f"  why: {self.reason}")
        lines += [f"  rejected {r}" for r in self.rejections]
        return "\n".join(lines)


class PlacementPolicy(Protocol):
    """Inter-group placement: decide where an arriving job goes. Must not mutate `state`."""

    name: str

    def place(self, job: JobSpec, state: ClusterState) -> PlacementDecision: ...


