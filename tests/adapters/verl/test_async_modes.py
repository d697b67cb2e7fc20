"""veRL 0.9.1's v1 async trainers opted in, on the CPU harness: ``colocate_async`` (partial rollout,
generation aborted at the end of each rollout and resumed after the weight push) runs gated against a
real coordinator (Redis) and sidecars, and generation only ever resumes inside a rollout permit;
``separate_async`` is refused by the driver before Ray starts."""

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
JOB = "asyncjob"


@pytest.fixture(scope="module")
def colocate_async(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not scenario.redis_available():
        pytest.fail("redis-server is missing: run scripts/setup.sh --dev")
    root = tmp_path_factory.mktemp("verl-async")
    job = VerlJob(name=JOB, assets=build(root / "assets"), workdir=root / JOB, steps=2,
                  extra=("trainer.v1.trainer_mode=colocate_async",))
    with scenario.rollmux_setup(root / "mux") as cluster:
        done = scenario.run([(job, scenario.opt_in(cluster, JOB))])
        events = read_jsonl(cluster.events)
    yield {"finished": done[JOB], "events": events}
    shutil.rmtree(job.ray_tmp(), ignore_errors=True)


def test_colocate_async_runs_gated_in_on_policy_order(colocate_async: dict) -> None:
    fin = colocate_async["finished"]
    log = fin.job.workdir / "job.log"
    assert fin.rc == 0, log.read_text(errors="replace")[-3000:]
    assert sorted(step_metrics(log)) == [1, 2]
    sp = spans(colocate_async["events"])
    assert not overlaps(sp) and not order_violations(sp), (overlaps(sp), order_violations(sp))
    owned = [(s.phase, s.iteration) for s in sp if s.job == JOB]
    assert owned[:6] == [(p, i) for i in range(2) for p in ("rollout", "train", "sync")], owned
    assert owned[6:] == [("rollout", 2)], owned  # the last step resumes the prefetched prompts too


def test_generation_resumes_only_inside_a_rollout_permit(colocate_async: dict) -> None:
    resumed = [(r["phase"], r["iteration"]) for r in colocate_async["events"] if r.get("event") == "resume_generation"]
    assert resumed == [("rollout", 1), ("rollout", 2)], resumed  # after each step's weight push


def test_separate_async_opted_in_is_refused_before_ray_starts(tmp_path: Path) -> None:
    job = VerlJob(name="sepasync", assets=build(tmp_path / "assets"), workdir=tmp_path / "job", steps=1,
                  extra=("trainer.v1.trainer_mode=separate_async",))
    proc = job.start({"ROLLMUX_SIDECAR_SOCKET": str(tmp_path / "sidecar.sock")})
    assert proc.wait(timeout=180) != 0
    log = (tmp_path / "job" / "job.log").read_text(errors="replace")
    assert "trainer.v1.trainer_mode=separate_async runs its standalone rollout pool" in log, log[-3000:]
    assert "unset ROLLMUX_SIDECAR_SOCKET" in log
    assert "ray init kwargs" not in log and "pid=" not in log, "Ray or a worker started before the refusal"
