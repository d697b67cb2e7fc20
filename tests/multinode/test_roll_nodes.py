"""Real ROLL (RLVR, 2 steps of the tiny model) with actor_train and actor_infer over two nodes (one fake GPU
each) on a real 3-raylet Ray cluster, with one real sidecar per node on a real coordinator (Redis): once
alone (RollMux off in its workers), once opted in. One module-scoped run of each; every test asserts on
their logs.

What the run shows (docs/how-to/multi-node-jobs.md, "ROLL"):
* I3: every ROLL worker that would hold GPU memory (actor_train's and actor_infer's, one of each per node)
  is a rank on its own node's sidecar;
* each node's permit is granted and released on that node's own sidecar, every phase;
* I1: every permit covers exactly the nodes the job's GPU ranks attached on;
* the rollout's progress is withheld (the rollout spans two nodes), so the coordinator never frees a node
  on which the job still generates;
* the job's per-step metrics equal its solo run's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from deployment import cluster_jobs, multinode
from raynodes import LABEL
from roll_nodes import HEAD_CPUS, RAY_BIN, raylet_env, start_job

from rollmux.adapters.common import env as adapter_env
from rollmux.shim import env
from tests.adapters.roll.testbed import build_assets, metric_mismatches, roll_unavailable

_reason = roll_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(_reason is not None, reason=str(_reason))]

JOB = "mnroll"
GPU_NODES = ("n1", "n2")
PHASES = [("rollout", 0), ("train", 0), ("sync", 0), ("rollout", 1), ("train", 1)]
"""A 2-step ROLL job's phases: the last step's weight push belongs to a step that never runs."""
GPU_CLUSTERS = ("actor_train", "actor_infer")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mnroll")
    build_assets(root)
    out: dict[str, Any] = {"root": root}
    with multinode(root / "dep", raylet_env=raylet_env(root / "roll-logs"), ray_bin=RAY_BIN, head_cpus=HEAD_CPUS) as dep:
        out["ray_nodes"] = dep.ray.alive()
        t0 = time.time()
        out["solo"] = start_job("solo", root, address=dep.address, opt_in=None).wait(600)
        t1 = time.time()
        opt_in = {env.SIDECAR_SOCKET: dep.sockets["n0"], env.EVENT_LOG: str(root / "phases.jsonl"), env.JOB: JOB,
                  adapter_env.SLO: "5", adapter_env.PHASE_S: "3,2"}  # the driver runs on the head, n0
        out["mux"] = start_job("mux", root, address=dep.address, opt_in=opt_in).wait(600)
        out["left"] = [j.job for j in cluster_jobs(dep)]
        out["wall_s"] = {"solo": round(t1 - t0, 1), "mux": round(time.time() - t1, 1)}
    out["node_events"] = read_jsonl(dep.node_events)
    out["phases"] = read_jsonl(root / "phases.jsonl")
    print(f"\nmulti-node ROLL runs (driver wall seconds): {out['wall_s']}")
    yield out
    shutil.rmtree(root / "solo", ignore_errors=True)
    shutil.rmtree(root / "mux", ignore_errors=True)


def job_events(runs: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [r for r in runs["node_events"] if r.get("event") == event and r.get("job") == JOB]


def test_the_cluster_has_three_nodes_and_both_runs_finish(runs: dict[str, Any]) -> None:
    assert sorted(runs["ray_nodes"]) == ["n0", "n1", "n2"]
    for which in ("solo", "mux"):
        assert runs[which]["rc"] == 0, f"{which} run failed: {runs[which]['log_tail']}"
        assert len(runs[which]["steps"]) == 2
    assert JOB not in runs["left"], "the finished job was not deregistered"


def gpu_workers(runs: dict[str, Any]) -> dict[str, set[int]]:
    """Node -> pids of the opted-in run's ROLL workers that would hold GPU memory (the harness's own probe)."""
    out: dict[str, set[int]] = defaultdict(set)
    for key, probe in runs["mux"]["workers"].items():
        if key.split("/")[0] in GPU_CLUSTERS:
            out[probe["labels"][LABEL]].add(probe["pid"])
    return out


def test_every_gpu_worker_is_a_rank_on_its_own_nodes_sidecar(runs: dict[str, Any]) -> None:
    gpu = gpu_workers(runs)
    attached: dict[str, set[int]] = defaultdict(set)
    for r in job_events(runs, "rank_attached"):
        attached[r["node"]].add(r["pid"])
    assert set(gpu) == set(GPU_NODES), gpu
    for node in GPU_NODES:
        assert len(gpu[node]) == len(GPU_CLUSTERS), f"expected one worker per GPU cluster on {node}: {gpu[node]}"
        assert gpu[node] <= attached[node], f"GPU workers on {node} that are no rank there: {gpu[node] - attached[node]}"
    everywhere = [p for n in attached for p in attached[n]]
    assert len(everywhere) == len(set(everywhere)), f"a process attached on two nodes: {dict(attached)}"
    assert "n0" not in attached, f"a rank of the job attached on the head: {attached['n0']}"


def test_every_phase_is_granted_and_released_on_each_nodes_own_sidecar(runs: dict[str, Any]) -> None:
    for event in ("granted", "released"):
        seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for r in job_events(runs, event):
            seen[r["node"]].append((r["phase"], r["iteration"]))
        assert {n: seen.get(n) for n in GPU_NODES} == dict.fromkeys(GPU_NODES, PHASES), (event, dict(seen))
        assert "n0" not in seen, f"the head's sidecar {event} a phase of the job: {seen['n0']}"


def test_ranks_on_each_node_hold_that_nodes_permit_and_it_covers_exactly_the_attach_nodes(
        runs: dict[str, Any]) -> None:
    """Every GPU worker holds every phase on its node, under a permit (epoch) its own node's sidecar granted;
    I1: every permit covers exactly the nodes the job's GPU ranks attached on."""
    adapter = [r for r in runs["phases"] if r.get("job") == JOB and r.get("kind") == "adapter"]
    rank_phases = [r for r in adapter if r["event"] == "rank_phase"]
    attached = [r for r in adapter if r["event"] == "rank_attached"]
    assert {r["node"] for r in attached} == set(GPU_NODES), attached
    assert sorted({r["role"] for r in attached}) == ["ActorWorker", "CpuInferWorker"]
    for node in GPU_NODES:
        ranks = len({r["pid"] for r in attached if r["node"] == node})
        held = [(r["phase"], r["iteration"]) for r in rank_phases if r["node"] == node and r["epoch"] > 0]
        assert sorted(held) == sorted(PHASES * ranks), (node, held)
        granted = {(r["phase"], r["iteration"], r["epoch"]) for r in job_events(runs, "granted") if r["node"] == node}
        assert {(r["phase"], r["iteration"], r["epoch"]) for r in rank_phases if r["node"] == node} <= granted
    assert {tuple(r["nodes"]) for r in rank_phases} == {GPU_NODES}
    entered = [r for r in adapter if r["event"] == "ranks_entered"]
    assert [(r["phase"], r["iteration"]) for r in entered] == PHASES
    assert {tuple(r["nodes"]) for r in entered} == {GPU_NODES}, [r["nodes"] for r in entered]
    assert {tuple(r["placement"].get("train", ())) for r in entered} == {GPU_NODES}


def test_a_rollout_over_two_nodes_withholds_its_progress(runs: dict[str, Any]) -> None:
    """ROLL cannot move a rollout's requests off a node mid-step: a report would let the coordinator migrate
    the tail and free a node on which the job still generates. Withheld, recorded once per rollout."""
    withheld = [(r["iteration"], tuple(r["nodes"])) for r in runs["phases"]
                if r.get("event") == "progress_withheld" and r.get("job") == JOB]
    assert withheld == [(0, GPU_NODES), (1, GPU_NODES)]
    assert runs["mux"]["progress"] == [], "progress reached the coordinator"
    assert not [r for r in runs["node_events"] if r.get("job") == JOB and "migrat" in str(r.get("event"))]


def test_per_step_metrics_equal_the_solo_run(runs: dict[str, Any]) -> None:
    assert runs["solo"]["steps"] and not metric_mismatches(runs["solo"]["steps"], runs["mux"]["steps"])
