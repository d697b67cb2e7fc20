from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollmux.cli import main
from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.sim.cli import add_policy_switches, policy_config_from


def test_simulate_writes_json_schema_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc = main(["simulate", "--jobs", "6", "--quiet", "--json", str(out), "--plots", str(tmp_path / "plots"),
               "--policies", "rollmux,solo-d,colocate,gavel+,random,most-idle,opt", "--emit-trace", str(tmp_path / "t.csv")])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"rollmux", "solo-d", "colocate", "gavel+", "random", "most-idle", "opt"}
    for entry in doc["policies"].values():
        assert isinstance(entry["avg_cost_per_hour"], float) and isinstance(entry["peak_cost_per_hour"], float)
        assert 0.0 <= entry["slo_attainment"] <= 1.0
        assert set(entry["peak_gpus"]) == {"rollout", "train"}
        assert all(isinstance(v, int) for v in entry["peak_gpus"].values())
    assert doc["policies"]["rollmux"]["cost_ratio_vs_rollmux"] == 1.0
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"cost_over_time.png", "gpus_per_pool.png"}
    # The emitted trace replays to the same numbers.
    out2 = tmp_path / "r2.json"
    assert main(["simulate", "--trace", str(tmp_path / "t.csv"), "--quiet", "--json", str(out2),
                 "--policies", "rollmux"]) == 0
    again = json.loads(out2.read_text())["policies"]["rollmux"]["avg_cost_per_hour"]
    assert abs(again - doc["policies"]["rollmux"]["avg_cost_per_hour"]) < 1e-6 * again


def test_opt_on_a_large_trace_is_refused_with_a_remedy(capsys) -> None:  # noqa: ANN001
    assert main(["simulate", "--jobs", "40", "--quiet", "--policies", "rollmux,opt"]) == 2
    assert "--jobs 14 or fewer" in capsys.readouterr().err


def test_malformed_trace_fails_before_simulating(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    path = tmp_path / "bad.csv"
    path.write_text("job_id,arrival_s,iterations,t_roll_s,t_train_s,n_rollout_gpus,n_train_gpus,slo,"
                    "rollout_state_gb,train_state_gb\na,0,1,1,1,8,8,0.5,1,1\n")
    assert main(["simulate", "--trace", str(path), "--quiet"]) == 2
    assert f"{path}:2" in capsys.readouterr().err


def test_unknown_policy_is_refused(capsys) -> None:  # noqa: ANN001
    assert main(["simulate", "--jobs", "3", "--quiet", "--policies", "rollmux,fifo"]) == 2
    assert "fifo" in capsys.readouterr().err


def test_every_policy_mechanism_has_a_switch() -> None:
    ap = argparse.ArgumentParser()
    add_policy_switches(ap)
    assert policy_config_from(ap.parse_args([])) == PolicyConfig(work_aware=True, best_move=True)
    off = policy_config_from(ap.parse_args(["--no-work-aware", "--no-pool-return", "--no-regroup-on-learn",
                                            "--no-pooled-joins", "--no-best-move", "--max-moves", "2",
                                            "--learn-min-samples", "5", "--coexec-margin-big", "0.02"]))
    assert (off.work_aware, off.pool_return, off.regroup_on_learn, off.pooled_joins, off.best_move) == (False,) * 5
    assert (off.max_moves_per_job, off.learn_min_samples, off.coexec_margin_big) == (2, 5, 0.02)
