"""Worst-case phase-time and resident-state estimates for a job that gives none.

Planning is conservative (paper §4.1): every response is assumed to hit max tokens, and the
runtime reclaims the slack. Measured solo times given by the user always win.

Model (a power law whose hardware term is physical and whose workload exponents are fitted):

    T_roll  = c_r * P^a_r * (L * turns)^b_r * (B / 256) / (N_R * HBM_TB/s)     memory-bandwidth bound
    T_train = c_t * P^a_t * (L * turns)^b_t * (B / 256) / (N_T * TFLOPS)      compute bound

with P the model size in billions of parameters, L the max response tokens, B the batch. The
coefficients are a least-squares fit in log space to the author's measured disaggregated phase
times (``shared/data/roll_phase_profile.json``, 16 configurations, 3B-32B x 4k-32k), assuming
the paper's testbed of 8 H20 rollout and 8 H800 training GPUs per job. Fit error (mean / max
relative): rollout 21.8% / 65.9%, training 11.0% / 25.4%; ``calibrate()`` recomputes it.
Rollout time grows only weakly with model size (a_r = 0.23) because bigger models run with more
tensor parallelism in the profile; length dominates (b_r = 1.02).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from rollmux.core.model import GB, ClusterSpec, JobSpec, Pool


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerLaw:
    """log(t * hardware) = log_c + a * log(P) + b * log(L * turns)."""

    log_c: float
    a: float  # exponent of model size (billions of parameters)
    b: float  # exponent of generated tokens per sequence

    def __call__(self, params_b: float, tokens: float) -> float:
        return math.exp(self.log_c + self.a * math.log(params_b) + self.b * math.log(tokens))


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    rollout: PowerLaw  # seconds x (N_R * HBM TB/s)
    train: PowerLaw  # seconds x (N_T * TFLOPS)
    rollout_mean_rel_err: float
    rollout_max_rel_err: float
    train_mean_rel_err: float
    train_max_rel_err: float


# Output of calibrate() on shared/data/roll_phase_profile.json (kept here so users need no data).
DEFAULT_CALIBRATION = Calibration(
    rollout=PowerLaw(log_c=-0.727729, a=0.228965, b=1.015468),
    train=PowerLaw(log_c=4.135295, a=0.651708, b=0.941199),
    rollout_mean_rel_err=0.218, rollout_max_rel_err=0.659,
    train_mean_rel_err=0.110, train_max_rel_err=0.254,
)

_REFERENCE_BATCH = 256
_REFERENCE_GPUS = 8

# Paper Table 2: host DRAM (GB) to cache one job's actors on an 8-GPU node.
_TABLE2_ROLLOUT_GB = ((3.0, 113.4), (7.0, 275.7), (14.0, 445.4), (32.0, 490.3))
_TABLE2_TRAIN_GB = ((3.0, 156.2), (7.0, 240.0), (14.0, 456.1), (32.0, 520.4))


def _interpolate(table: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear in model size; proportional scaling outside the table."""
    if x <= table[0][0]:
        return table[0][1] * x / table[0][0]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return table[-1][1] * x / table[-1][0]


def state_bytes_per_node(params_b: float) -> tuple[int, int]:
    """(rollout, train) resident host state per 8-GPU node, from Table 2."""
    return (int(_interpolate(_TABLE2_ROLLOUT_GB, params_b) * GB),
            int(_interpolate(_TABLE2_TRAIN_GB, params_b) * GB))


def estimate_phase_times(job: JobSpec, cluster: ClusterSpec,
                         calibration: Calibration = DEFAULT_CALIBRATION) -> tuple[float, float]:
    """Worst-case solo (T_roll, T_train) in seconds on the job's own GPUs of `cluster`'s types."""
    tokens = job.max_tokens * job.turns
    batch = job.batch_size / _REFERENCE_BATCH
    roll_hw = job.n_rollout_gpus * cluster.gpu_for(Pool.ROLLOUT).hbm_tb_s
    train_hw = job.n_train_gpus * cluster.gpu_for(Pool.TRAIN).tflops
    t_roll = calibration.rollout(job.model_params_b, tokens) * batch / roll_hw
    t_train = calibration.train(job.model_params_b, tokens) * batch / train_hw
    return t_roll, t_train


def resolve(job: JobSpec, cluster: ClusterSpec, calibration: Calibration = DEFAULT_CALIBRATION) -> JobSpec:
    """A copy of `job` with every missing estimate filled; given values are kept (they win)."""
    roll_b, train_b = state_bytes_per_node(job.model_params_b)
    t_roll, t_train = (job.t_roll_s, job.t_train_s)
    if t_roll is None or t_train is None:
        est_roll, est_train = estimate_phase_times(job, cluster, calibration)
        t_roll = est_roll if t_roll is None else t_roll
        t_train = est_train if t_train is None else t_train
    resolved = replace(
        job,
        t_roll_s=t_roll,
        t_train_s=t_train,
        rollout_state_bytes=roll_b if job.rollout_state_bytes is None else job.rollout_state_bytes,
        train_state_bytes=train_b if job.train_state_bytes is None else job.train_state_bytes,
    )
    resolved.validate_for(cluster)
    return resolved


def calibrate(profile_path: str | Path, *, rollout_hbm_tb_s: float = 4.0,
              train_tflops: float = 989.5) -> Calibration:
    """Fit the power laws to a `{"disagg": {"<P>B_<L>k": {"generate": s, "train": s}}}` profile."""
    import numpy as np

    entries = json.loads(Path(profile_path).read_text())["disagg"]
    rows = []
    for key, times in entries.items():
        size, length = key.split("_")
        rows.append((float(size.rstrip("B")), int(length.rstrip("k")) * 1024,
                     float(times["generate"]), float(times["train"])))
    data = np.array(rows)
    design = np.c_[np.ones(len(data)), np.log(data[:, 0]), np.log(data[:, 1])]

    def fit(measured: np.ndarray, hardware: float) -> tuple[PowerLaw, float, float]:
        coef, *_ = np.linalg.lstsq(design, np.log(measured * hardware), rcond=None)
        predicted = np.exp(design @ coef) / hardware
        rel = np.abs(predicted - measured) / measured
        return PowerLaw(log_c=float(coef[0]), a=float(coef[1]), b=float(coef[2])), float(rel.mean()), float(rel.max())

    roll, r_mean, r_max = fit(data[:, 2], _REFERENCE_GPUS * rollout_hbm_tb_s)
    train, t_mean, t_max = fit(data[:, 3], _REFERENCE_GPUS * train_tflops)
    return Calibration(rollout=roll, train=train, rollout_mean_rel_err=r_mean, rollout_max_rel_err=r_max,
                       train_mean_rel_err=t_mean, train_max_rel_err=t_max)
