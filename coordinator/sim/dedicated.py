"""Virtual-time replay of job-level allocations (Colocate, Gavel+): no groups, no interleaving.

Each job holds its allocation from arrival to its last iteration; its iterations run back to
back on the realised phase times, rescaled to the allocation's hardware. Co-located allocations
swap rollout and training state on the same GPUs every phase (veRL offloads between phases), so
they pay a warm-start load per phase; their weight sync stays inside one cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from rollmux.coordinator.policy.baselines.dedicated import DedicatedAllocation
from rollmux.coordinator.sim.api import JobOutcome, PolicyRun, ProgressFn, SimContext, TimelinePoint, TraceJob
from rollmux.coordinator.sim.runtime import JobDraws
from rollmux.core.model import ClusterSpec, JobSpec, Pool

AllocateFn = Callable[[JobSpec, ClusterSpec], DedicatedAllocation]


def iteration_times_s(draws: JobDraws, alloc: DedicatedAllocation, warm_start: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rollout, train) seconds per iteration of one job on `alloc`."""
    roll = draws.roll_s * alloc.roll_factor
    compute = np.maximum(draws.train_s - draws.two_stage_sync_s, 0.0) * alloc.train_factor
    if alloc.crosses_link:
        train = compute + draws.two_stage_sync_s + draws.flat_sync_extra_s
    else:
        switch_roll, switch_train = ((draws.warm_roll_s, draws.warm_train_s) if warm_start
                                     else (draws.cold_roll_s, draws.cold_train_s))
        roll = roll + switch_roll
        train = compute + switch_train
    return roll, train


class DedicatedStrategy:
    """A `SimStrategy` giving every job its own allocation from `allocate`."""

    def __init__(self, name: str, allocate: AllocateFn) -> None:
        self.name = name
        self.allocate = allocate

    def simulate(self, trace: Sequence[TraceJob], specs: dict[str, JobSpec], ctx: SimContext,
                 progress: ProgressFn | None = None) -> PolicyRun:
        started = time.perf_counter()
        deltas: list[tuple[float, int, float, int, int]] = []  # (t, order, $/h, rollout GPUs, train GPUs)
        busy = {Pool.ROLLOUT.value: 0.0, Pool.TRAIN.value: 0.0}
        outcomes = []
        for job in trace:
            alloc = self.allocate(specs[job.job_id], ctx.cluster)
            draws = ctx.draws[job.job_id]
            roll, train = iteration_times_s(draws, alloc, ctx.runtime.warm_start)
            finish = job.arrival_s + float(roll.sum() + train.sum())
            roll_pool_gpus = alloc.rollout_gpus if alloc.rollout_pool is Pool.ROLLOUT else alloc.train_gpus
            train_pool = Pool.TRAIN if alloc.train_gpus else Pool.ROLLOUT
            train_gpus = alloc.train_gpus or alloc.rollout_gpus
            busy[alloc.rollout_pool.value] += float(roll.sum()) * roll_pool_gpus
            busy[train_pool.value] += float(train.sum()) * train_gpus
            deltas.append((job.arrival_s, 1, alloc.usd_per_h, alloc.rollout_gpus, alloc.train_gpus))
            deltas.append((finish, 0, -alloc.usd_per_h, -alloc.rollout_gpus, -alloc.train_gpus))
            outcomes.append(JobOutcome(job_id=job.job_id, arrival_s=job.arrival_s, finish_s=finish,
                                       iterations=job.iterations, mean_iteration_s=(finish - job.arrival_s) / job.iterations,
                                       solo_iteration_s=draws.solo_iteration_s, slo=job.slo,
                                       planned_solo_s=job.t_roll_s + job.t_train_s, group_id=""))
            if progress is not None:
                progress(1)
        timeline = []
        usd, r, t_gpus = 0.0, 0, 0
        for t, _, d_usd, d_r, d_t in sorted(deltas):
            usd, r, t_gpus = usd + d_usd, r + d_r, t_gpus + d_t
            timeline.append(TimelinePoint(t_s=t, usd_per_h=max(0.0, usd), rollout_gpus=r, train_gpus=t_gpus))
        return PolicyRun(policy=self.name, timeline=tuple(timeline), jobs=tuple(outcomes), busy_gpu_s=busy,
                         wall_s=time.perf_counter() - started)
