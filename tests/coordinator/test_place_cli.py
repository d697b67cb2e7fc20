from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rollmux.cli import main


def test_place_runs_the_builtin_mix_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "place.json"
    assert main(["place", "--quiet", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["all_within_slo"] is True
    assert data["usd_per_h"] < data["solo_usd_per_h"]
    assert sum(len(g["jobs"]) for g in data["groups"]) == len(data["decisions"]) == 8
    assert "cheaper" in capsys.readouterr().out


def test_place_reports_a_bad_jobs_file_clearly(tmp_path, capsys) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text("- {name: a, n_rollout_gpus: 8, n_train_gpus: 0}\n")
    assert main(["place", "--jobs", str(bad)]) == 2
    assert "n_train_gpus=0 is invalid" in capsys.readouterr().out


def test_place_accepts_a_jobs_file(tmp_path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("- {name: a, n_rollout_gpus: 8, n_train_gpus: 8, t_roll_s: 300, t_train_s: 100}\n"
                    "- {name: b, n_rollout_gpus: 8, n_train_gpus: 8, t_roll_s: 100, t_train_s: 300, rollout_state_gb: 100}\n")
    out = tmp_path / "o.json"
    assert main(["place", "--quiet", "--jobs", str(jobs), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    # a goes alone, co-located on training GPUs ($42.24/h); b alone would cost as much again, so
    # regrouping pairs them in one disaggregated group (one rollout + one training node).
    assert data["decisions"][0]["deployment"] == "colocated-train"
    assert [g["jobs"] for g in data["groups"]] == [["a", "b"]] or [g["jobs"] for g in data["groups"]] == [["b", "a"]]
    assert data["usd_per_h"] == pytest.approx(8 * 1.85 + 8 * 5.28)
    assert data["moves"] and data["all_within_slo"] is True


def test_coordinator_side_never_imports_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import rollmux, rollmux.coordinator, rollmux.coordinator.policy, rollmux.coordinator.policy.profiler\n"
            "import rollmux.coordinator.placement_run, rollmux.cli\n"
            "rollmux.cli.main(['place', '--quiet'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
