from __future__ import annotations

import numpy as np
import pytest

from rollmux.coordinator.sim.runtime import RuntimeConfig, draw_job, sync_times_s
from rollmux.core.errors import SpecError

from .builders import trace_job


def test_draws_never_exceed_worst_case_and_tail_precedes_end() -> None:
    job = trace_job(iterations=500, roll=300, train=200)
    d = draw_job(job, RuntimeConfig(), seed=1)
    assert len(d.roll_s) == 500
    assert np.all(d.roll_s <= 300 + 1e-9) and np.all(d.train_s <= 200 + 1e-9)
    assert np.all(d.roll_tail_s <= d.roll_s)
    # Long tail: the longest of 256 responses nearly always hits the cap; training follows mean tokens.
    assert d.roll_s.mean() > 0.9 * 300
    assert 0.4 * 200 < d.train_s.mean() < 0.9 * 200
    assert d.roll_tail_s.mean() < 0.9 * d.roll_s.mean()


def test_draws_are_seeded_per_job() -> None:
    a = draw_job(trace_job("a"), RuntimeConfig(), seed=1)
    assert np.array_equal(a.train_s, draw_job(trace_job("a"), RuntimeConfig(), seed=1).train_s)
    assert not np.array_equal(a.train_s, draw_job(trace_job("b"), RuntimeConfig(), seed=1).train_s)


def test_worst_case_mode_is_deterministic() -> None:
    d = draw_job(trace_job(roll=120, train=80), RuntimeConfig(stochastic=False), seed=0)
    assert set(d.roll_s) == {120} and set(d.train_s) == {80}
    assert d.solo_iteration_s == pytest.approx(200)


def test_two_stage_sync_beats_flat_by_about_the_rank_count() -> None:
    flat, two = sync_times_s(7.0, 8, RuntimeConfig())
    assert 7.0 < flat / two < 8.3  # paper: 7.87-8.33x for 8 -> 8 GPUs
    d_flat = draw_job(trace_job(), RuntimeConfig(two_stage_sync=False), seed=0)
    assert d_flat.flat_sync_extra_s == pytest.approx(flat - two)
    assert draw_job(trace_job(), RuntimeConfig(), seed=0).flat_sync_extra_s == 0.0


def test_warm_start_is_seconds_and_cold_start_tens_of_seconds() -> None:
    d = draw_job(trace_job(roll_gb=275.7, train_gb=240.0), RuntimeConfig(), seed=0)
    assert 0.5 < d.warm_roll_s < 3 and 0.5 < d.warm_train_s < 6  # paper Fig. 4: 0.8-5.9 s
    assert d.cold_roll_s == pytest.approx(38.8) and d.cold_train_s == pytest.approx(32.7)  # 7B


def test_multi_turn_tail_is_in_the_last_turn() -> None:
    job = trace_job(iterations=50)
    job = type(job)(**{**{f: getattr(job, f) for f in job.__dataclass_fields__}, "turns": 4})
    d = draw_job(job, RuntimeConfig(), seed=0)
    assert np.all(d.roll_tail_s <= d.roll_s) and np.all(d.roll_tail_s > 0.5 * d.roll_s)


def test_config_validates() -> None:
    with pytest.raises(SpecError, match="tail_fraction"):
        RuntimeConfig(tail_fraction=1.5)
