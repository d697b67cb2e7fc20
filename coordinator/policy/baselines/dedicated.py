"""Job-level allocations for the baselines that do not form groups: Colocate (veRL) and Gavel+.

Each job gets a fixed set of GPUs for its whole life and runs its phases there, one after the
other (no interleaving with other jobs). Phase speed on other hardware follows the profiler's
model: rollout is memory-bandwidth bound (time ~ 1 / HBM TB/s per GPU), training is compute
bound (time ~ 1 / (GPUs x TFLOPS)). A rollout never runs faster for getting more GPUs than the
job's N_R: a synchronous rollout ends with its longest response, whose decode is sequential and
whose per-token latency is set by reading the weights of one replica, so more data-parallel
replicas do not shorten it in proportion (training, a fixed global batch, stretches linearly).

- Colocate (veRL): rollout and training on the job's N_T training GPUs (H800 only), so the
  rollout runs at H800 bandwidth. No SLO check, like veRL.
- Gavel+: Gavel (OSDI'20) made RL-aware as the paper describes it (§7.1): heterogeneity-aware,
  cost-normalised (Gavel's throughput-per-dollar objective with SLO rows), at job level, with no
  phase interleaving between jobs. Like Gavel it keeps the job's scale factor and chooses GPU
  types: each phase runs on the job's own GPU count (N_R for rollout, N_T for training) of the
  chosen type. The choices are the job's disaggregated pools (Solo-D), co-location on
  max(N_R, N_T) H800s (veRL), or co-location on max(N_R, N_T) H20s, where training runs at H20
  TFLOPS (148 vs 989.5, 6.7x slower per GPU). Memory never rules the last out here: an H20 has
  more HBM (96 GB) than an H800 (80 GB), so a training state sized for N_T H800s fits N_T H20s.
  It takes the allocation with the lowest cost per iteration whose planned (worst-case) iteration
  meets the SLO; Solo-D otherwise. An earlier version let the rollout spread over all N_R + N_T
  GPUs of an H20 co-location at a linear speed-up, which the decode physics above does not allow.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.coordinator.policy.modes import roll_factor, train_factor
from rollmux.core.model import ClusterSpec, JobSpec, Pool


@dataclass(frozen=True, slots=True, kw_only=True)
class DedicatedAllocation:
    """GPUs one job holds for its whole life, and how its phases run on them."""

    job: str
    label: str  # e.g. "disagg 8xH20+8xH800", "colocated 8xH800"
    rollout_gpus: int  # GPUs held in the rollout pool
    train_gpus: int  # GPUs held in the training pool
    rollout_pool: Pool  # where the Rollout phase runs
    roll_factor: float  # realised rollout time x this factor (speed of the hardware vs its own)
    train_factor: float  # realised train time x this factor
    crosses_link: bool  # weight sync crosses the inter-cluster link (disaggregated)
    usd_per_h: float

    @property
    def planned_iteration_factor(self) -> tuple[float, float]:
        return self.roll_factor, self.train_factor


def _price(cluster: ClusterSpec, rollout_gpus: int, train_gpus: int) -> float:
    return (rollout_gpus * cluster.gpu_for(Pool.ROLLOUT).usd_per_gpu_h
            + train_gpus * cluster.gpu_for(Pool.TRAIN).usd_per_gpu_h)


def solo_d_allocation(job: JobSpec, cluster: ClusterSpec) -> DedicatedAllocation:
    n_r = cluster.nodes_for(job.n_rollout_gpus) * cluster.gpus_per_node
    n_t = cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    return DedicatedAllocation(job=job.name, label=f"disagg {n_r}x{cluster.rollout_gpu}+{n_t}x{cluster.train_gpu}",
                               rollout_gpus=n_r, train_gpus=n_t, rollout_pool=Pool.ROLLOUT, roll_factor=1.0,
                               train_factor=1.0, crosses_link=True, usd_per_h=_price(cluster, n_r, n_t))


def colocated(job: JobSpec, cluster: ClusterSpec, pool: Pool = Pool.TRAIN, gpus: int | None = None) -> DedicatedAllocation:
    """All phases on `gpus` GPUs of `pool` (default: the job's N_T training GPUs, veRL-style).

    The rollout uses at most N_R of them (no speed-up beyond the job's own rollout parallelism).
    """
    n = gpus if gpus is not None else cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    roll = roll_factor(job, cluster, pool, n)
    train = train_factor(job, cluster, pool, n)
    name = cluster.train_gpu if pool is Pool.TRAIN else cluster.rollout_gpu
    return DedicatedAllocation(job=job.name, label=f"colocated {n}x{name}",
                               rollout_gpus=n if pool is Pool.ROLLOUT else 0,
                               train_gpus=n if pool is Pool.TRAIN else 0, rollout_pool=pool,
                               roll_factor=roll, train_factor=train, crosses_link=False,
                               usd_per_h=n * cluster.gpu_for(pool).usd_per_gpu_h)


def planned_iteration_s(job: JobSpec, alloc: DedicatedAllocation) -> float:
    assert job.t_roll_s is not None and job.t_train_s is not None
    return job.t_roll_s * alloc.roll_factor + job.t_train_s * alloc.train_factor


def gavel_plus(job: JobSpec, cluster: ClusterSpec) -> DedicatedAllocation:
    """The cheapest-per-iteration job-level allocation that meets the job's SLO (planned times)."""
    budget = job.slo * job.t_solo_s * (1 + 1e-9)
    n = cluster.nodes_for(max(job.n_rollout_gpus, job.n_train_gpus)) * cluster.gpus_per_node
    options = [solo_d_allocation(job, cluster), colocated(job, cluster, Pool.TRAIN, n),
               colocated(job, cluster, Pool.ROLLOUT, n)]
    feasible = [a for a in options if planned_iteration_s(job, a) <= budget]
    if not feasible:
        return solo_d_allocation(job, cluster)
    return min(feasible, key=lambda a: (a.usd_per_h * planned_iteration_s(job, a), a.usd_per_h))
