"""Placement policies by name: RollMux, the paper's baselines, and any a caller registers.

The built-ins are named as ``module:class`` and imported on first use, so the registry beside the
policies imports none of them and the policy package and its baselines form no import circle. The
simulator, the benchmarks, `rollmux place` and the coordinator build a policy with
`create_policy(name, config=..., seed=...)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from rollmux.coordinator.policy.api import PlacementPolicy, UnknownPolicyError

ONLINE_POLICIES = ("rollmux", "most-idle", "random", "solo-d")
"""Policies that place one arriving job at a time (what a live coordinator can run); every one is
built as ``create_policy(name, config=PolicyConfig(...), seed=N)``."""

_REGISTERED: dict[str, Callable[..., PlacementPolicy]] = {}
"""Policies registered by callers (`register_policy`), beside the built-ins."""


_BUILTINS: tuple[str, ...] = (
    "rollmux.coordinator.policy.placement:RollMuxPolicy",
    "rollmux.coordinator.policy.baselines:SoloDPolicy",
    "rollmux.coordinator.policy.baselines:RandomPolicy",
    "rollmux.coordinator.policy.baselines:MostIdlePolicy",
    "rollmux.coordinator.policy.baselines:OptPolicy",
)
"""The built-in policies, ``module:class`` (each class names itself in ``name``)."""


def _builtins() -> dict[str, Callable[..., PlacementPolicy]]:
    classes = [getattr(importlib.import_module(module), cls) for module, _, cls in (p.partition(":") for p in _BUILTINS)]
    return {p.name: p for p in classes}


def register_policy(name: str, factory: Callable[..., PlacementPolicy]) -> None:
    """Make a policy available by name to the simulator, benchmarks and coordinator."""
    _REGISTERED[name] = factory


def _all() -> dict[str, Callable[..., PlacementPolicy]]:
    return {**_builtins(), **_REGISTERED}


def create_policy(name: str, **kwargs: object) -> PlacementPolicy:
    """Build a policy by name.

    Raises:
        UnknownPolicyError: no built-in or registered policy has that name.
    """
    factories = _all()
    try:
        factory = factories[name]
    except KeyError:
        raise UnknownPolicyError(
            f"policy {name!r} is not registered: expected one of {sorted(factories)}. "
            "Did you forget to call `register_policy`?") from None
    return factory(**kwargs)


def registered_policies() -> list[str]:
    """Every name `create_policy` accepts."""
    return sorted(_all())


__all__ = ["ONLINE_POLICIES", "create_policy", "register_policy", "registered_policies"]
