"""Builders that keep test tables short (as Kueue's MakeWorkload does). Used by tests and benchmarks."""

from __future__ import annotations

from rollmux.core.model import GB, JobSpec


def make_job(name: str = "j", *, roll: float = 100.0, train: float = 100.0, slo: float = 1.5, n_r: int = 8,
             n_t: int = 8, roll_gb: float = 275.7, train_gb: float = 240.0) -> JobSpec:
    """A resolved job (phase times and per-node state given) with the paper's 7B defaults."""
    return JobSpec(name=name, n_rollout_gpus=n_r, n_train_gpus=n_t, slo=slo, t_roll_s=roll, t_train_s=train,
                   rollout_state_bytes=int(roll_gb * GB), train_state_bytes=int(train_gb * GB))
