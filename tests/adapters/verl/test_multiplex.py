"""Two real veRL 0.9.1 GRPO jobs (v1 sync and legacy RayPPOTrainer) multiplexed on the CPU harness
against a real coordinator (Redis) and real sidecars, compared with the same jobs run alone with the
variable unset. One session-scoped run per scenario; the tests assert on its event logs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))
import scenario  # noqa: E402
from assets import build  # noqa: E402
from job import VerlJob, read_jsonl, step_metrics  # noqa: E402

from rollmux.sidecar.report import order_violations, overlaps, spans  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
KEYS = ("actor/pg_loss", "critic/score/mean", "training/rollout_probs_diff_max")


def jobs(root: Path, assets: Path, tag: str) -> tuple[VerlJob, VerlJob]:
    return (VerlJob(name="v1job", assets=assets, workdir=root / tag / "v1job", steps=2),
            VerlJob(name="legacyjob", assets=assets, workdir=root / tag / "legacyjob", steps=2, legacy=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not scenario.redis_available():
        pytest.fail("redis-server is missing: run scripts/setup.sh --dev")
    root = tmp_path_factory.mktemp("verl")
    assets = build(root / "assets")
    solo = scenario.run([(j, None) for j in jobs(root, assets, "solo")][:1]) | \
        scenario.run([(j, None) for j in jobs(root, assets, "solo")][1:])
    with scenario.rollmux_setup(root / "mux") as cluster:
        pair = jobs(root, assets, "mux")
        envs = [scenario.opt_in(cluster, j.name, scenario.register(cluster, j.name)) for j in pair]
        mux = scenario.run(list(zip(pair, envs)))
        left = [j.job for j in cluster.client.cluster_state().jobs]
        events = read_jsonl(cluster.events)
    return {"solo": solo, "mux": mux, "events": events, "left": left}


def test_both_jobs_finish_interleaved_with_mutual_exclusion_and_on_policy_order(runs: dict) -> None:
    assert {n: f.rc for n, f in runs["mux"].items()} == {"v1job": 0, "legacyjob": 0}
    sp = spans(runs["events"])
    assert not overlaps(sp), overlaps(sp)
    assert not order_violations(sp), order_violations(sp)
    for name in ("v1job", "legacyjob"):
        owned = [(s.phase, s.iteration) for s in sp if s.job == name]
        assert owned == [(p, i) for i in range(2) for p in ("rollout", "train", "sync")], owned
    order = [s.job for s in sp if s.node == "train-0"]
    assert order != sorted(order), f"the jobs were not interleaved on train-0: {order}"
    assert runs["left"] == [], "finished jobs were not deregistered"


def test_multiplexing_changes_timing_only(runs: dict) -> None:
    for name in ("v1job", "legacyjob"):
        alone = step_metrics(runs["solo"][name].job.workdir / "job.log")
        muxed = step_metrics(runs["mux"][name].job.workdir / "job.log")
        assert sorted(alone) == sorted(muxed) == [1, 2]
        for step in alone:
            keys = [k for k in alone[step] if k in KEYS or (k.startswith("actor/") and not k.startswith("actor/perf"))]
            assert {"critic/score/mean", "training/rollout_probs_diff_max"} <= set(keys), keys
            for key in keys:
                assert math.isclose(alone[step][key], muxed[step][key], rel_tol=1e-3, abs_tol=1e-6), \
                    (name, step, key, alone[step][key], muxed[step][key])


def test_patches_land_in_trainer_and_worker_processes_only_when_opted_in(runs: dict) -> None:
    patched = [r for r in runs["events"] if r.get("event") == "patched"]
    trainer_pids = {r["pid"] for r in patched if r["module"].startswith("verl.trainer.ppo")}
    ckpt_pids = {r["pid"] for r in patched if r["module"] == "verl.checkpoint_engine.base"}
    attached = {r["pid"] for r in runs["events"] if r.get("event") == "attached"}
    assert attached and attached <= trainer_pids, "the phase tracker ran outside the trainer process"
    assert len(ckpt_pids - trainer_pids) >= 2, "no worker process applied the patches"
    for f in runs["solo"].values():  # the unset runs never loaded the adapter's patches
        assert not (f.job.workdir / "harness.jsonl").exists() or all(
            r.get("kind") != "adapter" for r in read_jsonl(f.job.workdir / "harness.jsonl"))
