"""Job-level allocations for the baselines that do not form groups: Colocate (veRL) and Gavel+.

Each job gets a fixed set of GPUs for its whole life and runs its phases there, one after the
other (no interleaving with other jobs). Phase speed on other hardware follows the profiler's
model: rollout is memory-bandwidth bound (time ~ 1 / (GPUs x HBM TB/s)), training is compute
bound (time ~ 1 / (GPUs x TFLOPS)).

- Colocate (veRL): rollout and training on the job's N_T training GPUs (H800 only), so the
  rollout runs at H800 bandwidth on N_T GPUs. No SLO check, like veRL.
- Gavel+: heterogeneity-aware and cost-normalised (Gavel's throughput-per-dollar objective with
  SLO rows), at job level and within the GPUs the job asked for (Gavel keeps a job's scale
  factor and picks types): among disaggregated (1..N_R/8 rollout nodes + N_T training GPUs) and
  co-located (1..N_T/8 H800 nodes, or 1..(N_R+N_T)/8 H20 nodes) allocations it takes the one with
  the lowest cost per iteration whose planned iteration meets the SLO; Solo-D otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollmux.model import ClusterSpec, JobSpec, Pool


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


def _bw(cluster: ClusterSpec, pool: Pool) -> float:
    return cluster.gpu_for(pool).hbm_tb_s


def _flops(cluster: ClusterSpec, pool: Pool) -> float:
    return cluster.gpu_for(pool).tflops


def solo_d_allocation(job: JobSpec, cluster: ClusterSpec) -> DedicatedAllocation:
    n_r = cluster.nodes_for(job.n_rollout_gpus) * cluster.gpus_per_node
    n_t = cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    return DedicatedAllocation(job=job.name, label=f"disagg {n_r}x{cluster.rollout_gpu}+{n_t}x{cluster.train_gpu}",
                               rollout_gpus=n_r, train_gpus=n_t, rollout_pool=Pool.ROLLOUT, roll_factor=1.0,
                               train_factor=1.0, crosses_link=True, usd_per_h=_price(cluster, n_r, n_t))


def colocated(job: JobSpec, cluster: ClusterSpec, pool: Pool = Pool.TRAIN, gpus: int | None = None) -> DedicatedAllocation:
    """All phases on `gpus` GPUs of `pool` (default: the job's N_T training GPUs, veRL-style)."""
    n = gpus if gpus is not None else cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    roll = job.n_rollout_gpus * _bw(cluster, Pool.ROLLOUT) / (n * _bw(cluster, pool))
    train = job.n_train_gpus * _flops(cluster, Pool.TRAIN) / (n * _flops(cluster, pool))
    name = cluster.train_gpu if pool is Pool.TRAIN else cluster.rollout_gpu
    return DedicatedAllocation(job=job.name, label=f"colocated {n}x{name}",
                               rollout_gpus=n if pool is Pool.ROLLOUT else 0,
                               train_gpus=n if pool is Pool.TRAIN else 0, rollout_pool=pool,
                               roll_factor=roll, train_factor=train, crosses_link=False,
                               usd_per_h=n * cluster.gpu_for(pool).usd_per_gpu_h)


def _disagg(job: JobSpec, cluster: ClusterSpec, rollout_nodes: int) -> DedicatedAllocation:
    n_r = rollout_nodes * cluster.gpus_per_node
    n_t = cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    return DedicatedAllocation(job=job.name, label=f"disagg {n_r}x{cluster.rollout_gpu}+{n_t}x{cluster.train_gpu}",
                               rollout_gpus=n_r, train_gpus=n_t, rollout_pool=Pool.ROLLOUT,
                               roll_factor=job.n_rollout_gpus / n_r, train_factor=1.0, crosses_link=True,
                               usd_per_h=_price(cluster, n_r, n_t))


def planned_iteration_s(job: JobSpec, alloc: DedicatedAllocation) -> float:
    assert job.t_roll_s is not None and job.t_train_s is not None
    return job.t_roll_s * alloc.roll_factor + job.t_train_s * alloc.train_factor


def gavel_plus(job: JobSpec, cluster: ClusterSpec) -> DedicatedAllocation:
    """The cheapest-per-iteration job-level allocation that meets the job's SLO (planned times)."""
    budget = job.slo * job.t_solo_s * (1 + 1e-9)
    base_r = cluster.nodes_for(job.n_rollout_gpus)
    base_t = cluster.nodes_for(job.n_train_gpus)
    options = [_disagg(job, cluster, k) for k in range(1, base_r + 1)]
    for pool, base in ((Pool.TRAIN, base_t), (Pool.ROLLOUT, base_r + base_t)):
        options += [colocated(job, cluster, pool, k * cluster.gpus_per_node) for k in range(1, base + 1)]
    feasible = [a for a in options if planned_iteration_s(job, a) <= budget]
    if not feasible:
        return solo_d_allocation(job, cluster)
    return min(feasible, key=lambda a: (a.usd_per_h * planned_iteration_s(job, a), a.usd_per_h))
