"""How fast, and at what memory, a job runs in each deployment mode: the policy's hardware model.

A job's worst-case solo times are measured (or profiled) on its own N_R rollout-pool GPUs and
N_T training-pool GPUs. On other hardware:

- Rollout is memory-bandwidth bound: time ~ 1 / HBM TB/s per GPU. It never runs faster for more
  GPUs than N_R (a synchronous rollout ends with its longest response, decoded sequentially on
  one replica), and slower in proportion on fewer.
- Training is compute bound with a fixed global batch: time ~ 1 / (GPUs x TFLOPS). Only an elastic
  job (`JobSpec.elastic`) stretches its data parallelism over more GPUs than its own: veRL and ROLL
  fix their world size at start (`trainer.nnodes`, device mappings), so a job that is not elastic
  trains on its own GPUs at its own speed in any group, however large the group's training pool
  (`world_gpus`).
- Co-located, a job swaps its rollout and training state on the same GPUs every phase (veRL
  offloads between phases): each phase first loads its state from pinned host DRAM; and its
  weights never cross the inter-cluster link, so the two-stage sync in its worst-case train time
  (one copy over the 20 Gbps link, then an all-gather) is not paid.

The simulator's Colocate and Gavel+ baselines use the same factors, so a co-located RollMux job
and a veRL job run at the same speed on the same GPUs.
"""

from __future__ import annotations

from rollmux.core.model import GB, ClusterSpec, Deployment, JobSpec, Pool

SWITCH_GB_S_PER_GPU = 25.0
"""Planning rate of a warm state load, pinned host DRAM to GPU, GB/s per GPU (the simulator's default)."""

CROSS_LINK_GB_S = 2.5
"""Inter-cluster link a disaggregated job's weights cross every iteration (20 Gbps), GB/s (the simulator's default)."""

INTRA_LINK_GB_S = 50.0
"""Intra-cluster fabric of the sync's all-gather stage (400 Gbps), GB/s."""

BYTES_PER_PARAM = 2  # BF16 weights


def sync_s(job: JobSpec) -> float:
    """The two-stage weight sync a disaggregated job's worst-case train time includes, s."""
    m_gb = job.model_params_b * BYTES_PER_PARAM
    r = job.n_rollout_gpus
    two = m_gb / CROSS_LINK_GB_S + (r - 1) / r * m_gb / INTRA_LINK_GB_S
    return min(two, job.t_train_s or 0.0)


def pool_of(deployment: Deployment) -> Pool:
    """The pool a co-located job runs on (disaggregated jobs train on the training pool)."""
    return Pool.ROLLOUT if deployment is Deployment.COLOCATED_ROLLOUT else Pool.TRAIN


def colocated_mode(pool: Pool) -> Deployment:
    return Deployment.COLOCATED_ROLLOUT if pool is Pool.ROLLOUT else Deployment.COLOCATED_TRAIN


def world_gpus(job: JobSpec, cluster: ClusterSpec, deployment: Deployment, gpus: int) -> int:
    """GPUs of a group's `gpus`-GPU training pool that the job's Train runs on: all of them when it is
    elastic, else its own (a fixed world size): its N_T GPUs disaggregated, and co-located the GPUs of
    its largest lone co-located shape (whole nodes for max(N_R, N_T)), which is what it was started on."""
    if job.elastic:
        return gpus
    if deployment is Deployment.DISAGGREGATED:
        return min(gpus, job.n_train_gpus)
    return min(gpus, cluster.nodes_for(max(job.n_rollout_gpus, job.n_train_gpus)) * cluster.gpus_per_node)


def train_stretch(job: JobSpec, gpus: int) -> float:
    """Disaggregated Train time on a `gpus`-GPU training pool over its solo time (1 unless elastic)."""
    return job.n_train_gpus / (gpus if job.elastic else min(gpus, job.n_train_gpus))


def roll_factor(job: JobSpec, cluster: ClusterSpec, pool: Pool, gpus: int) -> float:
    """Rollout time on `gpus` GPUs of `pool` over its solo time on N_R rollout-pool GPUs."""
    bw = cluster.gpu_for(Pool.ROLLOUT).hbm_tb_s / cluster.gpu_for(pool).hbm_tb_s
    return bw * job.n_rollout_gpus / min(gpus, job.n_rollout_gpus)


def train_factor(job: JobSpec, cluster: ClusterSpec, pool: Pool, gpus: int) -> float:
    """Train time on `gpus` GPUs of `pool` over its solo time on N_T training-pool GPUs (linear stretch)."""
    return job.n_train_gpus * cluster.gpu_for(Pool.TRAIN).tflops / (gpus * cluster.gpu_for(pool).tflops)


def training_fits(job: JobSpec, cluster: ClusterSpec, pool: Pool, gpus: int) -> bool:
    """The training state sized for N_T training GPUs fits the HBM of `gpus` GPUs of `pool`."""
    return (gpus >= job.n_train_gpus
            and gpus * cluster.gpu_for(pool).hbm_gb >= job.n_train_gpus * cluster.gpu_for(Pool.TRAIN).hbm_gb)


def switch_s(job: JobSpec, cluster: ClusterSpec) -> tuple[float, float]:
    """(rollout, train) warm-load seconds a co-located job pays before each of its phases."""
    rate = cluster.gpus_per_node * SWITCH_GB_S_PER_GPU * GB
    return (job.rollout_state_bytes or 0) / rate, (job.train_state_bytes or 0) / rate


def colocated_solo_s(job: JobSpec, cluster: ClusterSpec, pool: Pool, gpus: int) -> float:
    """Planned (worst-case) iteration of `job` alone, co-located on `gpus` GPUs of `pool`."""
    assert job.t_roll_s is not None and job.t_train_s is not None
    sw_r, sw_t = switch_s(job, cluster)
    return (job.t_roll_s * roll_factor(job, cluster, pool, gpus) + sw_r
            + (job.t_train_s - sync_s(job)) * train_factor(job, cluster, pool, gpus) + sw_t)
