"""Which pool's rank owns each phase's permit, by the job's deployment mode."""

from __future__ import annotations

from rollmux.core.model import PHASE_ORDER

COLOCATED_POOL = {"colocated-train": "train", "colocated-rollout": "rollout"}
"""The one pool every phase of a co-located job runs on (``rollmux.core.model.Deployment`` values)."""


def phase_pool(phase: str, deployment: str | None = None) -> str:
    """The pool whose node a phase's permit holds. Disaggregated (the default): rollout runs on the
    rollout pool, train and sync on the training pool (sync is part of T_train in the policy). A
    co-located job runs every phase on one pool: "colocated-train" on training nodes,
    "colocated-rollout" on rollout nodes (``rollmux.core.model.Deployment``)."""
    if phase not in PHASE_ORDER:
        raise ValueError(f"phase={phase!r} is not a RollMux phase: expected one of {', '.join(PHASE_ORDER)}")
    if deployment in (None, "", "disaggregated"):
        return "rollout" if phase == "rollout" else "train"
    if deployment in COLOCATED_POOL:
        return COLOCATED_POOL[deployment]
    raise ValueError(f"deployment={deployment!r} is not a RollMux deployment mode: expected disaggregated, "
                     f"{' or '.join(COLOCATED_POOL)}")


__all__ = ["COLOCATED_POOL", "phase_pool"]
