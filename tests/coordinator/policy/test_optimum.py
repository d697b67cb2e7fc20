from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from rollmux.coordinator.policy import ClusterState, RollMuxPolicy
from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.optimum import InstanceTooLargeError, cheapest_group, optimal_partition
from rollmux.core.model import ClusterSpec
from rollmux.testing.builders import make_job


def random_jobs(seed: int, n: int):
    rng = random.Random(seed)
    return [make_job(f"j{i}", roll=rng.uniform(50, 400), train=rng.uniform(50, 400), slo=rng.uniform(1, 2))
            for i in range(n)]


def partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in partitions(rest):
        yield [[first], *p]
        for i in range(len(p)):
            yield [*p[:i], [first, *p[i]], *p[i + 1:]]


@pytest.mark.parametrize("seed", range(4))
def test_optimum_matches_brute_force_over_all_partitions(seed: int) -> None:
    jobs = random_jobs(seed, 6)
    cluster, config = ClusterSpec(), PolicyConfig(modes=False)  # singletons priced disaggregated below
    best = float("inf")
    for part in partitions(jobs):
        groups = [cheapest_group(g, cluster, config) if len(g) > 1 else None for g in part]
        if any(g is None and len(p) > 1 for g, p in zip(groups, part)):
            continue
        cost = sum(g.usd_per_h if g else 8 * 1.85 + 8 * 5.28 for g in groups)
        best = min(best, cost)
    assert optimal_partition(jobs, cluster, config).usd_per_h == pytest.approx(best)


@pytest.mark.parametrize("seed", range(6))
def test_online_policy_is_never_cheaper_than_the_optimum(seed: int) -> None:
    jobs = random_jobs(100 + seed, 8)
    state = ClusterState()
    config = PolicyConfig(modes=False)  # the optimum's space is disaggregated groups (lone modes aside)
    policy = RollMuxPolicy(config)
    for j in jobs:
        state.apply(j, policy.place(j, state))
    assert optimal_partition(jobs, config=config).usd_per_h <= state.usd_per_h + 1e-9


def test_optimum_groups_cover_every_job_once() -> None:
    jobs = random_jobs(7, 8)
    part = optimal_partition(jobs)
    names = list(itertools.chain.from_iterable(g.jobs for g in part.groups))
    assert sorted(names) == sorted(j.name for j in jobs)


def test_too_large_instance_is_refused_clearly() -> None:
    with pytest.raises(InstanceTooLargeError, match="at most 14 jobs, got 15"):
        optimal_partition(random_jobs(0, 15))



def test_with_margins_the_optimum_keeps_the_online_policys_co_execution_margin() -> None:
    # b's SLO is its solo time: sharing the training pool at exactly that period is feasible on fixed
    # times, and not with the 2% margin a live join keeps below every member's budget.
    a, b = make_job("a", roll=100, train=100, slo=2.0), make_job("b", roll=100, train=100, slo=1.0)
    config = PolicyConfig()
    assert cheapest_group([a, b], ClusterSpec(), config) is not None
    assert cheapest_group([a, b], ClusterSpec(), config, margins=True) is None
    assert cheapest_group([a, replace(b, slo=1.03)], ClusterSpec(), config, margins=True) is not None
