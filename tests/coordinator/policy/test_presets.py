"""The policy's three presets are defined once beside `PolicyConfig`, and the live coordinator holds one."""

from __future__ import annotations

from rollmux.coordinator.policy.api import LIVE_MERGE_CANDIDATES, PolicyConfig
from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.runtime.state import live_policy_config


def test_each_preset_changes_only_its_own_knobs_from_the_base() -> None:
    base = PolicyConfig()
    changed = {name: {f: v for f, v in vars_of(preset()).items() if vars_of(base)[f] != v}
               for name, preset in (("paper", PolicyConfig.paper), ("simulator", PolicyConfig.simulator),
                                    ("live", PolicyConfig.live))}
    assert changed == {
        "paper": {"modes": False, "learn": False, "regroup": False},
        "simulator": {"work_aware": True, "best_move": True},
        "live": {"modes": False, "work_aware": True, "best_move": True, "merge_candidates": LIVE_MERGE_CANDIDATES},
    }


def test_a_caller_switches_a_mechanism_off_on_top_of_a_preset() -> None:
    assert PolicyConfig.live(regroup=False).regroup is False
    assert PolicyConfig.live(regroup=False).merge_candidates == LIVE_MERGE_CANDIDATES


def test_the_live_coordinator_runs_the_policy_its_service_config_holds() -> None:
    assert ServiceConfig().policy == PolicyConfig.live()
    config = ServiceConfig(policy=PolicyConfig.live(modes=True, learn=False))
    assert live_policy_config(config, max_group_size=3) == PolicyConfig.live(modes=True, learn=False, max_group_size=3)


def vars_of(config: PolicyConfig) -> dict[str, object]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}
