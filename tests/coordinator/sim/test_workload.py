from __future__ import annotations

from importlib import resources

import pytest

from rollmux.coordinator.sim.workload import PROFILES, SloSpec, Workload, generate, load_arrivals
from rollmux.core.errors import SpecError


@pytest.mark.parametrize(("text", "low", "high"), [("1.2", 1.2, 1.2), ("U(1,2)", 1.0, 2.0), (" u(1.1, 1.5) ", 1.1, 1.5)])
def test_slo_spec_parses(text: str, low: float, high: float) -> None:
    spec = SloSpec.parse(text)
    assert (spec.low, spec.high) == (low, high)


@pytest.mark.parametrize("text", ["0.9", "fast", "U(2,1)", "U(0.5,1)"])
def test_slo_spec_refuses(text: str) -> None:
    with pytest.raises(SpecError, match="slo"):
        SloSpec.parse(text)


def test_packaged_arrivals_are_compact_and_sorted() -> None:
    data = resources.files("rollmux.coordinator.sim").joinpath("data/philly_arrivals.csv")
    assert len(data.read_bytes()) < 300_000
    arrivals = load_arrivals()
    assert 1000 <= len(arrivals) <= 5000
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(arrivals, arrivals[1:]))


def test_default_trace_is_300_jobs_over_hundreds_of_hours() -> None:
    jobs = generate("mixed")
    assert len(jobs) == 300
    span_h = (jobs[-1].arrival_s - jobs[0].arrival_s) / 3600
    assert 300 < span_h < 900
    assert generate("mixed") == jobs  # seeded


@pytest.mark.parametrize("workload", [Workload.BALANCED, Workload.ROLLOUT_HEAVY, Workload.TRAIN_HEAVY])
def test_phase_times_follow_table6(workload: Workload) -> None:
    for job in generate(workload, 60, seed=1, slo="1.2"):
        size = {8: 0, 16: 1, 32: 2}[job.n_rollout_gpus]
        (r_lo, r_hi), (t_lo, t_hi) = PROFILES[workload][size]
        assert r_lo <= job.t_roll_s <= r_hi and t_lo <= job.t_train_s <= t_hi
        assert job.n_train_gpus == job.n_rollout_gpus and job.slo == 1.2
        assert job.model == {0: "7B", 1: "14B", 2: "32B"}[size]


def test_mixed_draws_all_profiles_and_sizes() -> None:
    jobs = generate("mixed", 200, seed=2)
    assert {j.n_rollout_gpus for j in jobs} == {8, 16, 32}
    heavy_roll = sum(j.t_roll_s > 2 * j.t_train_s for j in jobs)
    heavy_train = sum(j.t_train_s > 2 * j.t_roll_s for j in jobs)
    assert heavy_roll > 20 and heavy_train > 20
    assert all(1.0 <= j.slo <= 2.0 for j in jobs)
