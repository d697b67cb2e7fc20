"""Small trace builders for the simulator tests."""

from __future__ import annotations

from rollmux.coordinator.sim.api import TraceJob


def trace_job(job_id: str = "a", *, arrival: float = 0.0, iterations: int = 20, roll: float = 100.0,
              train: float = 100.0, gpus: int = 8, slo: float = 1.5, roll_gb: float = 275.7,
              train_gb: float = 240.0, model: str = "7B") -> TraceJob:
    return TraceJob(job_id=job_id, arrival_s=arrival, iterations=iterations, t_roll_s=roll, t_train_s=train,
                    n_rollout_gpus=gpus, n_train_gpus=gpus, slo=slo, rollout_state_gb=roll_gb,
                    train_state_gb=train_gb, model=model)
