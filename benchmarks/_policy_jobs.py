"""Seeded random jobs for the policy benchmarks: the paper's Table 6 mixed workload.

Phase ranges and size classes come from the simulator's workload module, so the benchmarks and
the simulator draw from one definition.
"""

from __future__ import annotations

import random

from rollmux.coordinator.policy.profiler import state_bytes_per_node
from rollmux.coordinator.sim.workload import PROFILES, SIZES
from rollmux.core.model import JobSpec


def mixed_jobs(n: int, seed: int, *, prefix: str = "j", sizes: str = "SML", slo: tuple[float, float] = (1.0, 2.0)
               ) -> list[JobSpec]:
    """`n` jobs, each one of the nine (profile, size) pairs uniformly, SLO ~ U(slo)."""
    rng = random.Random(seed)
    size_idx = [i for i, s in enumerate(SIZES) if s.label in sizes]
    jobs = []
    for i in range(n):
        profile = rng.choice(list(PROFILES))
        k = rng.choice(size_idx)
        (r_lo, r_hi), (t_lo, t_hi) = PROFILES[profile][k]
        size = SIZES[k]
        roll_b, train_b = state_bytes_per_node(float(size.model.rstrip("B")))
        jobs.append(JobSpec(name=f"{prefix}{i}", n_rollout_gpus=size.gpus, n_train_gpus=size.gpus,
                            slo=rng.uniform(*slo), t_roll_s=rng.uniform(r_lo, r_hi),
                            t_train_s=rng.uniform(t_lo, t_hi), rollout_state_bytes=roll_b,
                            train_state_bytes=train_b))
    return jobs
