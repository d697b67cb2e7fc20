from __future__ import annotations

import pytest

from rollmux.coordinator.policy.profiler import DEFAULT_CALIBRATION, calibrate, resolve, state_bytes_per_node
from rollmux.core.model import GB, ClusterSpec, JobSpec


def test_measured_times_win_over_estimates(cluster: ClusterSpec) -> None:
    job = resolve(JobSpec(name="j", n_rollout_gpus=8, n_train_gpus=8, t_roll_s=11.0, t_train_s=22.0), cluster)
    assert (job.t_roll_s, job.t_train_s) == (11.0, 22.0)


def test_estimates_follow_the_physics(cluster: ClusterSpec) -> None:
    base = resolve(JobSpec(name="a", n_rollout_gpus=8, n_train_gpus=8, model_params_b=7, max_tokens=8192), cluster)
    longer = resolve(JobSpec(name="b", n_rollout_gpus=8, n_train_gpus=8, model_params_b=7, max_tokens=16384), cluster)
    wider = resolve(JobSpec(name="c", n_rollout_gpus=16, n_train_gpus=16, model_params_b=7, max_tokens=8192), cluster)
    assert longer.t_roll_s > 1.9 * base.t_roll_s and longer.t_train_s > 1.8 * base.t_train_s
    assert wider.t_roll_s == pytest.approx(base.t_roll_s / 2) and wider.t_train_s == pytest.approx(base.t_train_s / 2)
    # Magnitude check against the measured 7B/8k disaggregated profile (133.8 s, 112.8 s).
    assert 0.5 < base.t_roll_s / 133.8 < 2 and 0.5 < base.t_train_s / 112.8 < 2


def test_state_defaults_are_table2() -> None:
    roll, train = state_bytes_per_node(7.0)
    assert roll == int(275.7 * GB) and train == int(240.0 * GB)
    roll14, _ = state_bytes_per_node(10.5)
    assert int(275.7 * GB) < roll14 < int(445.4 * GB)


def test_calibration_constants_match_a_refit_of_the_shared_profile(shared_dir) -> None:
    fit = calibrate(shared_dir / "data" / "roll_phase_profile.json")
    for ours, theirs in ((DEFAULT_CALIBRATION.rollout, fit.rollout), (DEFAULT_CALIBRATION.train, fit.train)):
        assert (ours.log_c, ours.a, ours.b) == pytest.approx((theirs.log_c, theirs.a, theirs.b), abs=1e-5)
    assert fit.train_mean_rel_err == pytest.approx(DEFAULT_CALIBRATION.train_mean_rel_err, abs=1e-3)
    assert fit.rollout_mean_rel_err == pytest.approx(DEFAULT_CALIBRATION.rollout_mean_rel_err, abs=1e-3)
