"""The real ROLL ``RLVRPipeline.run()`` and ``AgenticPipeline.run()``, 2 steps each, solo and multiplexed
through real RollMux services.

One module-scoped run feeds every case (a ROLL job takes minutes to build when several build at once
on 2 cores). Variable unset (solo):

* ``solo-a``: an RLVR job (greedy decoding); ``solo-b``: another learning rate (the comparison's negative
  control). That a rerun of ``solo-a`` agrees with it is shown by ``mux-a``, the same job opted in, which
  must equal it metric for metric;
No agentic job runs solo: ``mux-g``'s per-step metrics could not be compared with one (the env manager
plays episodes continuously and ROLL's random LLM proxy draws from the process's ``random``, so which
action lands in a batch depends on timing), and the unset variable's no-patch check of the agentic
pipeline's workers is the same patcher's, shown on the RLVR jobs.

Opted in, on one rollout node and one training node (redis-server, coordinator, two sidecars):
``mux-a``, ``mux-b`` and ``mux-g`` (the same jobs as the solo ones) and ``mux-k`` (RLVR), which the
test SIGKILLs (driver and its whole Ray instance) while it holds a permit. Once all four are built (the
harness waits on a start file), ``mux-g`` starts first and the three RLVR jobs start when it holds its
first permit: the agentic job's start-up after the go signal is much slower than an RLVR job's, and
started together the RLVR jobs had once finished before its first phase.

The solo jobs run first and the opted-in ones start once they are done, so at most four ROLL jobs
(~2 GB each) are alive at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .testbed import (
    Job,
    Pools,
    build_assets,
    launch,
    metric_mismatches,
    overlaps_on_a_node,
    phase_records,
    roll_unavailable,
    stable_metrics,
    wait_built,
)

_reason = roll_unavailable()
if _reason:
    print(f"ROLL pipeline tests skipped: {_reason}")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200),
              pytest.mark.skipif(_reason is not None, reason=str(_reason))]

LR = {"a": 1e-3, "b": 3e-3, "k": 2e-3, "g": 1e-3}
KIND = {"g": "agentic"}
LEASE_TTL_S = 5.0
ORDER = [("rollout", 0), ("train", 0), ("sync", 0), ("rollout", 1), ("train", 1)]
"""A 2-step job's phases: the last step's weight push belongs to a step that never runs."""
SOLO = ("solo-a", "solo-b")
MUX = ("mux-a", "mux-b", "mux-g", "mux-k")


@dataclass
class Kill:
    """What the killer thread saw: the phase it killed in, and when the nodes let go of the job."""

    job: str
    held: Any = None  # the Lease the job held when killed
    t_kill: float | None = None
    t_freed: float | None = None
    error: str = ""
    samples: list[tuple[float, list[str]]] = field(default_factory=list)


def _holders(client: Any) -> dict[str, Any]:
    return {n.node_id: n.holder for n in client.cluster_state().nodes if n.holder is not None}


def _killer(pools: Pools, job: Job, kill: Kill, stop: threading.Event) -> None:
    """SIGKILL `job` 0.3 s into the first permit it holds; then time until no node holds it."""
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(pools.coordinator.address, retry_s=2.0)
    try:
        while kill.t_kill is None and not stop.wait(0.05):
            held = [h for h in _holders(client).values() if h.job == kill.job]
            if held:
                time.sleep(0.3)
                kill.held, kill.t_kill = held[0], time.time()
                job.kill()
        while kill.t_freed is None and not stop.wait(0.05):
            if not any(h.job == kill.job for h in _holders(client).values()):
                kill.t_freed = time.time()
    except Exception as exc:  # reported by the test that reads it
        kill.error = repr(exc)
    finally:
        client.close()


def _admission(pools: Pools) -> dict[str, str]:
    """Each registered job's admission as the coordinator reports it: its group, or why it waits."""
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(pools.coordinator.address, retry_s=2.0)
    try:
        return {j.job: j.group_id if j.state == "admitted" else f"{j.state} at {j.pending_position}: {j.placement}"
                for j in client.cluster_state().jobs}
    finally:
        client.close()


def _start_after_first_permit(pools: Pools, first: Job, go_first: Any, go_rest: Any,
                              timeout_s: float = 300) -> float | None:
    """Let `first` run, then the rest once it holds a node (or exited, or `timeout_s` passed).

    Returns the seconds until `first` held a node; None if it never did (the interleave check then fails)."""
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(pools.coordinator.address, retry_s=2.0)
    t0 = time.monotonic()
    try:
        go_first.touch()
        while time.monotonic() - t0 < timeout_s and first.proc.poll() is None:
            if any(h.job == first.name for h in _holders(client).values()):
                return time.monotonic() - t0
            time.sleep(0.05)
        return None
    finally:
        go_rest.touch()
        client.close()


def _launch(name: str, wd: Any, **kw: Any) -> Job:
    key = name.split("-")[1][0]
    return launch(name, wd, kind=KIND.get(key, "rlvr"), lr=LR[key], **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    wd = tmp_path_factory.mktemp("roll")
    build_assets(wd)
    pools = Pools(wd, lease_ttl_s=LEASE_TTL_S).start()
    events, go, go_g = wd / "events.jsonl", wd / "go", wd / "go-g"
    jobs: dict[str, Job] = {}
    try:
        jobs.update({n: _launch(n, wd) for n in SOLO})
        results: dict[str, Any] = {n: jobs[n].wait(timeout_s=600) for n in SOLO}
        for n in MUX:
            jobs[n] = _launch(n, wd, start_file=go_g if n == "mux-g" else go,
                              extra_env={**pools.job_env(events), "ROLLMUX_JOB": n})
        kill, stop = Kill(job="mux-k"), threading.Event()
        wait_built([jobs[n] for n in MUX])  # on failure the fixture's clean-up kills them
        results["admission"] = _admission(pools)  # each registered before it built
        results["agentic_first_permit_s"] = _start_after_first_permit(pools, jobs["mux-g"], go_g, go)
        killer = threading.Thread(target=_killer, args=(pools, jobs["mux-k"], kill, stop), daemon=True)
        killer.start()
        results.update({n: jobs[n].wait(timeout_s=600) for n in MUX})
        stop.set()
        killer.join(10)
        results["kill"] = kill
        results["leftovers"] = {n: j.leftovers() for n, j in jobs.items()}
        results["records"] = phase_records(events)
        yield results
    finally:
        for j in jobs.values():
            j.kill()
        pools.stop()


def _ok(res: dict[str, Any]) -> list[dict[str, Any]]:
    assert res["rc"] == 0, res["log_tail"]
    assert len(res["steps"]) == 2
    return res["steps"]


def test_solo_runs_train_and_differ_with_the_learning_rate(runs: dict[str, Any]) -> None:
    a, b = (_ok(runs[n]) for n in ("solo-a", "solo-b"))
    assert "actor/pg_loss@sum" in a[0] and "actor_train/grad_norm" in a[0]  # a real train_step ran
    assert stable_metrics(a[0])["token/response_length/mean"] > 0
    assert metric_mismatches(a, b, rel=1e-9, abs_tol=0.0) != []  # another learning rate: the comparison can fail


def test_the_agentic_job_trains_multiplexed(runs: dict[str, Any]) -> None:
    for name in ("mux-g",):
        steps = _ok(runs[name])
        assert "actor/pg_loss@sum" in steps[0] and "actor_train/grad_norm" in steps[0], sorted(steps[0])
        assert any(k.startswith("env/FrozenLake/") for k in steps[0]), sorted(steps[0])  # a real env rollout


def test_unset_variable_patches_no_ray_worker(runs: dict[str, Any]) -> None:
    for name in ("solo-a", "solo-b"):
        workers = runs[name]["workers"]
        assert {"actor_train/0", "actor_infer/0", "scheduler/math_rule"} <= workers.keys()
        assert any(k.startswith("reward") for k in workers), workers
    assert {"actor_train/0", "actor_infer/0", "scheduler/train_rollout_scheduler"} <= runs["mux-g"]["workers"].keys()
    for name in SOLO:
        workers = runs[name]["workers"]
        assert all(not w.get("loaded") and not w.get("applied") for w in workers.values()), (name, workers)
    # the probe sees patches where there are some: the opted-in jobs' workers hold the worker-side hooks
    sched = runs["mux-a"]["workers"]["scheduler/math_rule"]
    assert sched["loaded"] and any("generate_scheduler" in t for t in sched["applied"]), sched
    assert runs["mux-g"]["workers"]["actor_train/0"]["loaded"], runs["mux-g"]["workers"]


def test_multiplexed_jobs_equal_their_solo_runs(runs: dict[str, Any]) -> None:
    assert metric_mismatches(_ok(runs["solo-a"]), _ok(runs["mux-a"])) == []
    assert metric_mismatches(_ok(runs["solo-b"]), _ok(runs["mux-b"])) == []


def _interleaved(x: list[dict[str, Any]], y: list[dict[str, Any]]) -> bool:
    """Whether a phase of one job started while the other job was between its first and last phase."""
    return any(x[0]["t_start"] < r["t_start"] < x[-1]["t_end"] for r in y) or \
        any(y[0]["t_start"] < r["t_start"] < y[-1]["t_end"] for r in x)


def test_every_opted_in_job_is_admitted_into_the_one_group(runs: dict[str, Any]) -> None:
    """With the solo phase times declared (``ROLLMUX_PHASE_S``), the SLO check admits all four jobs
    beside each other; otherwise a job waits for a group member to finish and runs apart."""
    admission = runs["admission"]
    assert admission.keys() == set(MUX) and len(set(admission.values())) == 1, admission


def test_phases_interleave_one_job_per_node_in_on_policy_order(runs: dict[str, Any]) -> None:
    assert overlaps_on_a_node(runs["records"]) == []
    mine = {job: [r for r in runs["records"] if r["job"] == job] for job in ("mux-a", "mux-b", "mux-g")}
    for job, recs in mine.items():
        assert [(r["phase"], r["iteration"]) for r in recs] == ORDER, (job, recs)
        pools = {r["phase"]: r["node"] for r in recs}  # actor_infer shares actor_train's GPU: co-located
        assert pools == {"rollout": "t0", "train": "t0", "sync": "t0"}, (job, pools)
    assert _interleaved(mine["mux-a"], mine["mux-b"]), "the two RLVR jobs ran one after the other"


def test_each_rollout_reports_its_progress_under_its_permit(runs: dict[str, Any]) -> None:
    """RLVR (the batch path here) and agentic rollouts report 0 / n and n / n through the gate to the
    sidecar, while the job holds its Rollout permit; unset jobs report nothing."""
    for job in ("mux-a", "mux-b", "mux-g"):
        reports = runs[job]["progress"]
        done = [(f, t) for f, t, phase in reports if phase == "rollout" and f == t > 0]
        assert len(done) == 2 and all(phase == "rollout" for *_, phase in reports), (job, reports)
    assert all(runs[n]["progress"] is None for n in SOLO)


def test_the_agentic_job_interleaves_with_an_rlvr_job(runs: dict[str, Any]) -> None:
    assert runs["agentic_first_permit_s"] is not None, "mux-g never held a node"
    mine = {job: [r for r in runs["records"] if r["job"] == job] for job in ("mux-a", "mux-b", "mux-g")}
    assert _interleaved(mine["mux-g"], mine["mux-a"]) or _interleaved(mine["mux-g"], mine["mux-b"]), \
        "the agentic job ran apart from both RLVR jobs"


def test_sigkill_mid_phase_frees_the_nodes_within_the_lease_ttl(runs: dict[str, Any]) -> None:
    kill: Kill = runs["kill"]
    assert not kill.error, kill.error
    assert kill.t_kill is not None, "mux-k never held a permit"
    assert runs["mux-k"]["rc"] != 0
    assert kill.t_freed is not None and kill.t_freed - kill.t_kill <= LEASE_TTL_S + 1.0, \
        f"{kill.held} still held {None if kill.t_freed is None else kill.t_freed - kill.t_kill:.1f} s after SIGKILL"
    assert runs["leftovers"]["mux-k"] == [], "processes of the killed job survived"
    for n in ("mux-a", "mux-b", "mux-g"):
        _ok(runs[n])
