from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.coordinator.sim.api import TraceError
from rollmux.coordinator.sim.trace import REQUIRED, read_trace, to_job_spec, write_trace
from rollmux.coordinator.sim.workload import generate
from rollmux.core.model import ClusterSpec

HEADER = ",".join(REQUIRED)
GOOD = "a,0,10,100,120,8,8,1.5,275.7,240.0"


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    jobs = generate("mixed", 12, seed=3)
    write_trace(jobs, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv")
    assert [j.job_id for j in back] == [j.job_id for j in jobs]
    for a, b in zip(jobs, back):
        assert (a.iterations, a.n_rollout_gpus, a.model, a.turns) == (b.iterations, b.n_rollout_gpus, b.model, b.turns)
        assert a.t_roll_s == pytest.approx(b.t_roll_s, abs=1e-3)
        assert a.slo == pytest.approx(b.slo, abs=1e-4)


def test_optional_columns_default(tmp_path: Path) -> None:
    (job,) = read_trace(write(tmp_path, HEADER, GOOD))
    assert (job.max_tokens, job.turns, job.model) == (8192, 1, "")
    assert job.model_params_b == 7.0


def test_rows_are_sorted_by_arrival(tmp_path: Path) -> None:
    jobs = read_trace(write(tmp_path, HEADER, "b,50,1,1,1,8,8,1,1,1", "a,10,1,1,1,8,8,1,1,1"))
    assert [j.job_id for j in jobs] == ["a", "b"]


@pytest.mark.parametrize(("row", "needle"), [
    ("a,-5,10,100,120,8,8,1.5,275.7,240.0", "arrival_s='-5'"),
    ("a,0,0,100,120,8,8,1.5,275.7,240.0", "iterations='0'"),
    ("a,0,10,abc,120,8,8,1.5,275.7,240.0", "t_roll_s='abc'"),
    ("a,0,10,100,0,8,8,1.5,275.7,240.0", "t_train_s='0'"),
    ("a,0,10,100,120,8,8,0.9,275.7,240.0", "slo='0.9'"),
    ("a,0,10,100,120,7.5,8,1.5,275.7,240.0", "n_rollout_gpus='7.5'"),
    ("a,0,10,100,120,8,8,1.5,,240.0", "rollout_state_gb is missing"),
    ("a,0,10,100,120,8,8,1.5,275.7,240.0,extra", "fields"),
], ids=["negative-arrival", "zero-iterations", "text-time", "zero-train", "slo-below-1", "fractional-gpus",
        "missing-state", "extra-field"])
def test_bad_row_names_file_line_and_field(tmp_path: Path, row: str, needle: str) -> None:
    path = write(tmp_path, HEADER, GOOD.replace("a,", "ok,", 1), row)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert f"{path}:3" in str(err.value)
    assert needle in str(err.value)
    assert "nothing was simulated" in str(err.value)


def test_every_bad_row_is_listed(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER, "a,0,0,1,1,8,8,1,1,1", "b,0,1,1,1,8,8,0,1,1")
    message = str(pytest.raises(TraceError, read_trace, path).value)
    assert f"{path}:2" in message and f"{path}:3" in message and "2 malformed" in message


def test_missing_column_and_duplicates(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="lacks column.*slo"):
        read_trace(write(tmp_path, HEADER.replace(",slo", ""), "a,0,1,1,1,8,8,1,1"))
    with pytest.raises(TraceError, match="duplicates line 2"):
        read_trace(write(tmp_path, HEADER, GOOD, GOOD))
    with pytest.raises(TraceError, match="no jobs"):
        read_trace(write(tmp_path, HEADER))
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.csv")


def test_state_larger_than_dram_is_refused(tmp_path: Path) -> None:
    (job,) = read_trace(write(tmp_path, HEADER, "a,0,10,100,120,8,8,1.5,2500,240"))
    with pytest.raises(TraceError, match="host DRAM"):
        to_job_spec(job, ClusterSpec())
