"""veRL 0.9.1's v1 trainers in the modes beyond the plain sync loop, opted in on the CPU harness against a
real coordinator (Redis) and sidecars, two jobs at once: ``colocate_async`` (partial rollout: generation
aborted at the end of each rollout, resumed after the weight push) and a v1 sync job that validates
after every step (validation generates after the sync). Every generate call the harness's rollout
server ran lies inside one of its job's rollout permits. ``separate_async`` is refused by the driver
before Ray starts."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))
import scenario  # noqa: E402
from assets import build  # noqa: E402
from job import VerlJob, read_jsonl, step_metrics  # noqa: E402

from rollmux.demo.report import order_violations, overlaps, spans  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ASYNC, VAL = "asyncjob", "valjob"
ON_POLICY = [(p, i) for i in range(2) for p in ("rollout", "train", "sync")]


@pytest.fixture(scope="module")
def runs(verl_workspace: tuple[Path, Path]) -> dict:
    root, assets = verl_workspace
    jobs = [VerlJob(name=ASYNC, assets=assets, workdir=root / ASYNC, steps=2,
                    extra=("trainer.v1.trainer_mode=colocate_async",)),
            VerlJob(name=VAL, assets=assets, workdir=root / VAL, steps=2, extra=("trainer.test_freq=1",))]
    with scenario.rollmux_setup(root / "mux") as cluster:
        done = scenario.run([(j, scenario.opt_in(cluster, j.name)) for j in jobs])
        events = read_jsonl(cluster.events)
    yield {"finished": done, "events": events, "spans": spans(events)}
    for j in jobs:
        shutil.rmtree(j.ray_tmp(), ignore_errors=True)


def owned(runs: dict, job: str) -> list[tuple[str, int]]:
    return [(s.phase, s.iteration) for s in runs["spans"] if s.job == job]


def test_both_jobs_finish_in_on_policy_order_without_overlap(runs: dict) -> None:
    for name, fin in runs["finished"].items():
        log = fin.job.workdir / "job.log"
        assert fin.rc == 0, (name, log.read_text(errors="replace")[-3000:])
        assert sorted(step_metrics(log)) == [1, 2]
    sp = runs["spans"]
    assert not overlaps(sp) and not order_violations(sp), (overlaps(sp), order_violations(sp))
    # both open one rollout more after their last sync: colocate_async resumes generation for the
    # prefetched prompts, the sync job validates (veRL does both before fit returns)
    assert owned(runs, ASYNC) == [*ON_POLICY, ("rollout", 2)], owned(runs, ASYNC)
    assert owned(runs, VAL) == [*ON_POLICY, ("rollout", 2)], owned(runs, VAL)
    validated = step_metrics(runs["finished"][VAL].job.workdir / "job.log")
    assert all("timing_s/testing" in validated[step] for step in (1, 2)), "valjob did not validate after each step"


def test_generation_resumes_only_inside_a_rollout_permit(runs: dict) -> None:
    resumed = [(r["phase"], r["iteration"]) for r in runs["events"] if r.get("event") == "resume_generation"]
    assert resumed == [("rollout", 1), ("rollout", 2)], resumed  # after each step's weight push


def test_every_generate_call_runs_inside_its_jobs_rollout_permit(runs: dict) -> None:
    for name, fin in runs["finished"].items():
        rollouts = [s for s in runs["spans"] if s.job == name and s.phase == "rollout"]
        calls = [r for r in read_jsonl(fin.job.workdir / "harness.jsonl") if r.get("kind") == "server.generate"]
        assert calls, f"{name}: the harness server recorded no generate call"
        outside = [c for c in calls if not any(s.start <= c["start"] and c["end"] <= s.end for s in rollouts)]
        assert not outside, (name, len(outside), len(calls), outside[:3], [(s.start, s.end) for s in rollouts])


def test_separate_async_opted_in_is_refused_before_ray_starts(tmp_path: Path) -> None:
    job = VerlJob(name="sepasync", assets=build(tmp_path / "assets"), workdir=tmp_path / "job", steps=1,
                  extra=("trainer.v1.trainer_mode=separate_async",))
    proc = job.start({"ROLLMUX_SIDECAR_SOCKET": str(tmp_path / "sidecar.sock")})
    assert proc.wait(timeout=180) != 0
    log = (tmp_path / "job" / "job.log").read_text(errors="replace")
    assert "trainer.v1.trainer_mode=separate_async runs its standalone rollout pool" in log, log[-3000:]
    assert "unset ROLLMUX_SIDECAR_SOCKET" in log
    assert "ray init kwargs" not in log and "pid=" not in log, "Ray or a worker started before the refusal"
