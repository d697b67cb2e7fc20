"""The runtime model: what a phase really takes, iteration by iteration.

Planning uses worst-case times (every response at max tokens). At runtime:

- Response lengths are long-tailed (log-normal, median `length_median_frac` of the cap) and
  capped at max tokens. A rollout lasts as long as its longest response, so it usually runs
  close to the worst case; `roll_tail_s` is when `tail_fraction` of the responses are done.
  We draw the batch's order statistics directly (the maximum via U^(1/n), the tail quantile via
  a Beta draw) instead of all n lengths, which keeps 300-job traces fast.
- Training time follows the tokens actually generated: a fixed share (optimizer step, prompt
  tokens, sync) plus a share proportional to the mean response length.
- Long-tail migration (paper §4.3, Fig. 7): once `tail_fraction` of the responses are done, the
  remaining requests are consolidated onto `tail_gpu_share` of the job's rollout GPUs (the one
  rule of `policy.migration`, which the live coordinator applies to whole nodes) and its
  nodes pass to the next rollout in their turn (`policy.executor.run_schedule`'s
  `rollout_release` hook); the job's own Train still starts when its last response ends. The tail
  keeps running on those few GPUs, so the release is delayed by the GPU-time it still uses
  (tail seconds x `tail_gpu_share`): a work-conserving charge to the next rollout, which runs on
  the rest of the node meanwhile. Re-prefilling the moved requests takes seconds and is neglected.
- Context switches: with warm start a phase on a shared pool first loads the job's state from
  pinned host DRAM (state bytes per node over `gpus_per_node` host-to-GPU links); with
  `--cold-start` it pays the paper's Fig. 4 cold-start time instead.
- Weight sync crosses the 20 Gbps inter-cluster link. Worst-case T_train includes a two-stage
  sync (one copy crosses, then an intra-cluster all-gather); `--flat-sync` adds the difference to
  a flat fan-out where every rollout rank pulls a full copy over the slow link.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from rollmux.coordinator.policy.migration import MigrationRule
from rollmux.coordinator.sim.api import TraceJob
from rollmux.core.errors import SpecError

_NORMAL = NormalDist()

# Paper Fig. 4: cold-start seconds by model size (billions), rollout and train.
_COLD_ROLLOUT = ((3.0, 25.3), (7.0, 38.8), (14.0, 60.4), (32.0, 81.7))
_COLD_TRAIN = ((3.0, 26.7), (7.0, 32.7), (14.0, 59.0), (32.0, 81.2))


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """Switches and constants of the runtime model (defaults: all RollMux mechanisms on)."""

    stochastic: bool = True  # draw phase times below the worst case; False: always the worst case
    migration: bool = True  # long-tail migration
    warm_start: bool = True  # False: every context switch is a cold start (Fig. 4)
    two_stage_sync: bool = True  # False: flat fan-out weight sync over the cross-cluster link
    tail_fraction: float = 0.8  # share of responses done when a rollout becomes tail-bound
    tail_gpu_share: float = 0.125  # share of its rollout GPUs the consolidated tail keeps (1 GPU in 8)
    length_median_frac: float = 0.45  # median response length / max tokens
    length_sigma: float = 0.6  # log-normal shape of response lengths
    train_fixed_frac: float = 0.25  # share of worst-case train time independent of response length
    host_to_gpu_gb_s: float = 25.0  # effective pinned-host-to-GPU copy rate per GPU, GB/s
    cross_link_gb_s: float = 2.5  # inter-cluster link (20 Gbps), GB/s
    intra_link_gb_s: float = 50.0  # intra-cluster fabric (400 Gbps), GB/s
    bytes_per_param: int = 2  # BF16 weights

    @property
    def migration_rule(self) -> MigrationRule:
        """The long-tail migration rule, shared with the live coordinator (`policy.migration`)."""
        return MigrationRule(threshold=self.tail_fraction, tail_share=self.tail_gpu_share)

    def __post_init__(self) -> None:
        for name in ("tail_fraction", "tail_gpu_share", "length_median_frac", "train_fixed_frac"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise SpecError(f"runtime.{name}={v!r} is invalid: expected 0 < value <= 1")
        for name in ("length_sigma", "host_to_gpu_gb_s", "cross_link_gb_s", "intra_link_gb_s"):
            v = getattr(self, name)
            if not v > 0:
                raise SpecError(f"runtime.{name}={v!r} is invalid: expected a number > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDraws:
    """One job's realised phase times per iteration (seconds, on its own solo GPUs)."""

    roll_s: np.ndarray  # full rollout: until the longest response ends
    roll_tail_s: np.ndarray  # until `tail_fraction` of the responses are done
    train_s: np.ndarray  # training incl. two-stage sync
    flat_sync_extra_s: float  # added to every Train when sync is flat
    warm_roll_s: float  # warm-start load of the rollout state
    warm_train_s: float  # warm-start load of the training state
    cold_roll_s: float  # cold start of the rollout actors
    cold_train_s: float  # cold start of the training actors
    two_stage_sync_s: float  # the sync share of the worst-case train time

    def release_s(self, it: int, rule: MigrationRule, gpus: int) -> float:
        """When iteration `it`'s rollout hands its nodes on under long-tail migration (s from its start)."""
        return rule.release_after_s(float(self.roll_tail_s[it]), float(self.roll_s[it]), gpus)

    @property
    def solo_iteration_s(self) -> float:
        """Mean iteration alone on dedicated GPUs (no switches, nobody to migrate to)."""
        return float(np.mean(self.roll_s + self.train_s)) + self.flat_sync_extra_s


def _interpolate(table: tuple[tuple[float, float], ...], x: float) -> float:
    if x <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return table[-1][1] * x / table[-1][0]


def sync_times_s(params_b: float, n_rollout_gpus: int, cfg: RuntimeConfig) -> tuple[float, float]:
    """(flat, two-stage) weight-sync seconds for one model copy to `n_rollout_gpus` ranks.

    Flat: every rank pulls a full copy over the slow link, R * M / B_cross. Two-stage: one copy
    crosses, then the ranks all-gather it, M / B_cross + (R - 1) / R * M / B_intra.
    """
    m_gb = params_b * cfg.bytes_per_param  # GB (params in billions)
    r = n_rollout_gpus
    flat = r * m_gb / cfg.cross_link_gb_s
    two = m_gb / cfg.cross_link_gb_s + (r - 1) / r * m_gb / cfg.intra_link_gb_s
    return flat, two


def _inv_norm(p: np.ndarray) -> np.ndarray:
    clipped = np.clip(p, 1e-12, 1 - 1e-12)
    return np.fromiter((_NORMAL.inv_cdf(float(x)) for x in clipped.ravel()), float, clipped.size).reshape(p.shape)


def _capped_mean(median: float, sigma: float) -> float:
    """E[min(X, 1)] for X log-normal with the given median and shape."""
    mu = np.log(median)
    below = float(np.exp(mu + sigma**2 / 2) * _NORMAL.cdf((-mu - sigma**2) / sigma))
    return below + (1 - _NORMAL.cdf(-mu / sigma))


def draw_job(job: TraceJob, cfg: RuntimeConfig, seed: int, gpus_per_node: int = 8, batch_size: int = 256) -> JobDraws:
    """Realised per-iteration phase times of `job`, seeded by (seed, job id)."""
    params_b = job.model_params_b
    flat, two = sync_times_s(params_b, job.n_rollout_gpus, cfg)
    extra = 0.0 if cfg.two_stage_sync else flat - two
    warm_r = job.rollout_state_gb / (gpus_per_node * cfg.host_to_gpu_gb_s)
    warm_t = job.train_state_gb / (gpus_per_node * cfg.host_to_gpu_gb_s)
    common = dict(flat_sync_extra_s=extra, warm_roll_s=warm_r, warm_train_s=warm_t,
                  cold_roll_s=_interpolate(_COLD_ROLLOUT, params_b), cold_train_s=_interpolate(_COLD_TRAIN, params_b),
                  two_stage_sync_s=min(two, job.t_train_s))
    n_it, turns = job.iterations, job.turns
    if not cfg.stochastic:
        full = np.full(n_it, job.t_roll_s)
        return JobDraws(roll_s=full, roll_tail_s=full * cfg.tail_fraction, train_s=np.full(n_it, job.t_train_s), **common)
    rng = np.random.default_rng([seed, zlib.crc32(job.job_id.encode())])
    mu, sigma, n = np.log(cfg.length_median_frac), cfg.length_sigma, batch_size
    k = max(1, int(np.ceil(cfg.tail_fraction * n)))
    u_max = rng.random((n_it, turns)) ** (1.0 / n)  # CDF value of the longest response
    u_tail = rng.beta(k, n + 1 - k, size=(n_it, turns))  # CDF value of the k-th shortest
    x_max = np.minimum(1.0, np.exp(mu + sigma * _inv_norm(u_max)))
    x_tail = np.minimum(x_max, np.exp(mu + sigma * _inv_norm(u_tail)))
    # Mean length over a batch of n: its expectation plus the sampling noise of an n-mean.
    mean = _capped_mean(cfg.length_median_frac, sigma)
    x_mean = np.clip(mean + rng.normal(0.0, 0.35 / np.sqrt(n), size=(n_it, turns)), 0.0, 1.0)
    roll = job.t_roll_s * x_max.mean(axis=1)
    # Turns run back to back: the tail is only in the last one.
    tail = job.t_roll_s * (x_max[:, :-1].sum(axis=1) + x_tail[:, -1]) / turns
    f = cfg.train_fixed_frac
    train = job.t_train_s * (f + (1 - f) * x_mean.mean(axis=1))
    return JobDraws(roll_s=roll, roll_tail_s=tail, train_s=train, **common)
