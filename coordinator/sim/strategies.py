"""Policy names the simulator knows, and how to build each one's `SimStrategy`."""

from __future__ import annotations

from collections.abc import Sequence

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.baselines import OptPolicy
from rollmux.coordinator.policy.baselines.dedicated import colocated, gavel_plus
from rollmux.coordinator.policy.optimum import MAX_OPT_JOBS, optimal_partition
from rollmux.coordinator.policy.placement import RollMuxPolicy
from rollmux.coordinator.policy.registry import ONLINE_POLICIES, create_policy
from rollmux.coordinator.sim.api import SimContext, SimError, SimStrategy
from rollmux.coordinator.sim.dedicated import DedicatedStrategy
from rollmux.coordinator.sim.driver import GroupStrategy
from rollmux.core.model import JobSpec

ALL_POLICIES = ("rollmux", "solo-d", "colocate", "gavel+", "random", "most-idle", "rollmux-alg1", "opt")
DEFAULT_POLICIES = ALL_POLICIES[:-2]  # Algorithm 1 alone and opt only on request (opt is exponential)


def make_strategy(name: str, specs: Sequence[JobSpec], ctx: SimContext) -> SimStrategy:
    """The strategy for policy `name` on this job set.

    Raises:
        SimError: unknown name, or `opt` on more jobs than the offline optimum can solve.
    """
    config = PolicyConfig(max_group_size=ctx.max_group_size)
    if name == "rollmux":
        return GroupStrategy(name, RollMuxPolicy(ctx.policy_config or config))
    if name == "rollmux-alg1":  # the paper's Algorithm 1 alone: no modes, worst-case times, no regrouping
        return GroupStrategy(name, RollMuxPolicy(PolicyConfig.paper(max_group_size=ctx.max_group_size)))
    if name in ONLINE_POLICIES:  # by name, as `rollmux coordinator --policy` and `rollmux place --policy` build them
        return GroupStrategy(name, create_policy(name, config=config, seed=ctx.seed))
    if name == "colocate":
        return DedicatedStrategy(name, colocated)
    if name == "gavel+":
        return DedicatedStrategy(name, gavel_plus)
    if name == "opt":
        if len(specs) > MAX_OPT_JOBS:
            raise SimError(f"policy 'opt' solves at most {MAX_OPT_JOBS} jobs exactly, the trace has {len(specs)}: "
                           f"use --jobs {MAX_OPT_JOBS} or fewer, or leave 'opt' out of --policies")
        return GroupStrategy(name, OptPolicy(optimal_partition(list(specs), ctx.cluster, config)))
    raise SimError(f"policy {name!r} is unknown: expected one of {', '.join(ALL_POLICIES)}")
