"""The one long-tail migration rule: when a rollout is tail-bound, what its tail keeps, when units pass on."""

from __future__ import annotations

import pytest

from rollmux.coordinator.policy.api import PolicyError
from rollmux.coordinator.policy.migration import MigrationRule
from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.sim.runtime import RuntimeConfig


def test_tail_bound_at_the_threshold() -> None:
    rule = MigrationRule(threshold=0.8)
    assert not rule.tail_bound(79, 100) and rule.tail_bound(80, 100) and not rule.tail_bound(0, 0)


def test_the_tail_keeps_its_share_at_least_one_unit_and_never_all_nodes() -> None:
    rule = MigrationRule(tail_share=0.125)
    assert [rule.kept_units(u) for u in (1, 4, 8, 9, 16)] == [1, 1, 1, 2, 2]
    assert rule.kept_share(8) == 0.125 and rule.kept_share(4) == 0.25
    assert rule.plan(("r0",), {"r0"}) is None  # one node: nothing to hand on
    assert rule.plan(("r0", "r1"), set()) is None  # nobody waits: keep running undisturbed
    assert rule.plan(("r0", "r1", "r2"), {"r1"}) == (("r0",), ("r1", "r2"))  # waited-for nodes go first
    assert rule.plan(("r0", "r1"), {"r0", "r1"}) == (("r0",), ("r1",))


def test_units_pass_on_at_the_tail_bound_point_plus_the_tails_gpu_time() -> None:
    rule = MigrationRule(tail_share=0.125)
    assert rule.release_after_s(80.0, 100.0, 8) == pytest.approx(80.0 + 20.0 / 8)
    assert rule.release_after_s(80.0, 70.0, 8) == 80.0  # a tail that ended early costs nothing


def test_service_and_simulator_build_the_same_rule_from_their_knobs() -> None:
    assert ServiceConfig().migration_rule == RuntimeConfig().migration_rule == MigrationRule()
    with pytest.raises(PolicyError, match="tail_share"):
        MigrationRule(tail_share=0.0)
