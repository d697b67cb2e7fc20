"""A job trains on its own GPUs unless it declares itself elastic (`JobSpec.elastic`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementDecision, Strategy
from rollmux.coordinator.policy.grants import group_rings
from rollmux.coordinator.policy.intra_group import cycle_time
from rollmux.coordinator.policy.optimum import cheapest_group
from rollmux.coordinator.policy.regroup import apply_moves, plan_moves
from rollmux.core.model import ClusterSpec, Deployment
from rollmux.testing.builders import make_job


def _two_node_group_with_small_member(elastic: bool) -> ClusterState:
    """A 16-GPU job opens a group on two training nodes; an 8-GPU job joins it."""
    state = ClusterState()
    big = make_job("big", roll=100, train=100, n_r=16, n_t=16, slo=3.0)
    state.apply(big, PlacementDecision(job="big", strategy=Strategy.ISOLATED, group_id=None, rollout_nodes=(),
                                       new_rollout_nodes=2, new_train_nodes=2, delta_usd_per_h=0.0))
    small = replace(make_job("small", roll=100, train=120, slo=3.0), elastic=elastic)
    state.apply(small, PlacementDecision(job="small", strategy=Strategy.ROLLOUT_SCALING, group_id="g0",
                                         rollout_nodes=(), new_rollout_nodes=1, new_train_nodes=0, delta_usd_per_h=0.0))
    return state


@pytest.mark.parametrize(("elastic", "train_s", "nodes"), [(False, 120.0, 1), (True, 60.0, 2)],
                         ids=["fixed-world-size", "elastic"])
def test_a_member_trains_on_its_own_nodes_unless_elastic(elastic: bool, train_s: float, nodes: int) -> None:
    state = _two_node_group_with_small_member(elastic)
    group = state.groups["g0"]
    member = group.members["small"]
    assert member.t_train_in_group_s == pytest.approx(train_s)
    assert member.train_nodes == group.train_nodes[:nodes]
    rings = group_rings(group, {})
    holding = [n for n in group.train_nodes if "small" in rings[n].order]
    assert holding == list(member.train_nodes)  # its Train permit names exactly these nodes
    assert all("big" in rings[n].order for n in group.train_nodes)


def test_a_pool_merge_trains_fixed_world_sizes_side_by_side_and_elastic_ones_over_the_pool() -> None:
    policy = RollMuxPolicy(PolicyConfig(modes=False, best_move=True))
    for elastic in (False, True):
        state = ClusterState()
        for name in ("a", "b"):  # too train-heavy to share one training node within SLO 1.5
            job = replace(make_job(name, roll=40, train=160, slo=1.5), elastic=elastic)
            state.apply(job, policy.place(job, state))
        moves = plan_moves(state, policy, ["b"], lambda _: 1e7)
        assert any("pool their training nodes" in m.reason for m in moves)
        apply_moves(state, moves)
        (group,) = state.groups.values()
        a, b = group.members["a"].train_nodes, group.members["b"].train_nodes
        assert len(group.train_nodes) == 2 and len(group.rollout) == 1  # one rollout node saved
        if elastic:  # each Train stretched over both nodes, back to back
            assert a == b == group.train_nodes
        else:  # each on its own node, side by side: both keep their solo period
            assert not set(a) & set(b)
            assert cycle_time(group.timings()) == pytest.approx(200.0)


def test_the_optimum_prices_members_at_their_own_speed() -> None:
    cluster = ClusterSpec()
    big = make_job("big", roll=100, train=100, n_r=16, n_t=16, slo=2.0)
    small = make_job("small", roll=60, train=240, slo=1.1)
    # Fixed world size: big's two nodes carry 100 + 240 s of Train per round > 1.1 x 300 s for small.
    assert cheapest_group([big, small], cluster, PolicyConfig()) is None
    # Elastic: small's Train stretches to 120 s on both nodes, and the pair fits on big's two.
    elastic = cheapest_group([big, replace(small, elastic=True)], cluster, PolicyConfig())
    assert elastic is not None and elastic.train_nodes == 2


def test_the_deployment_of_a_new_group_is_unchanged_by_elasticity() -> None:
    policy = RollMuxPolicy(PolicyConfig())
    for elastic in (False, True):
        job = replace(make_job("a", roll=40, train=160, slo=1.5), elastic=elastic)
        assert policy.place(job, ClusterState()).deployment is Deployment.COLOCATED_TRAIN
