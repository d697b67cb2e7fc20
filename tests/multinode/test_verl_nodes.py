"""Real veRL 0.9.1 GRPO with ``trainer.nnodes=2`` (one fake GPU per node) on a real 3-raylet Ray cluster,
with one real sidecar per node on a real coordinator (Redis): once alone (RollMux off in its workers), once
opted in. One module-scoped run of each; every test asserts on their logs.

What the run shows (docs: DESIGN.md "Where a job runs"):
* I3: every process of the job that would hold GPU memory (the FSDP ``WorkerDict`` actors and the
  rollout servers, pinned per node) is a rank on its own node's sidecar;
* each node's permit is granted and released on that node's own sidecar, every phase;
* no rollout request is served on a node outside a rollout permit held there;
* I1 for this layout: the permit's nodes are the nodes the ranks attached on;
* the job's per-step metrics equal its solo run's.

Coordinator work these runs do not show yet (no assertion here would fail today, so none is marked
xfail): the coordinator frees all of a permit's nodes when the first node's sidecar releases (per-node
release, I2), and places the job by node id order, not by where its ranks attached (I4: the pools are laid
out so that both agree); a sidecar granted a job with no local rank drops the grant.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from deployment import cluster_jobs, multinode
from verl_nodes import MultiNodeJob, raylet_env

from rollmux.adapters.common import env as adapter_env
from rollmux.sidecar import env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOB = "mnjob"
GPU_NODES = ("n1", "n2")
KEYS = ("actor/pg_loss", "critic/score/mean", "training/rollout_probs_diff_max")
NOISE_KEYS_ABS_TOL = {"training/rollout_probs_diff_max": 5e-5}  # fp32 reduction-order noise (test_multiplex.py)
PHASES = [(p, i) for i in range(2) for p in ("rollout", "train", "sync")]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    from job import read_jsonl as read

    return read(path)


@pytest.fixture(scope="module")
def runs(verl_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mn")
    harness_events = root / "harness.jsonl"
    out: dict[str, Any] = {"root": root}
    with multinode(root / "dep", raylet_env=raylet_env(harness_events)) as dep:
        out["ray_nodes"] = dep.ray.alive()
        solo = MultiNodeJob(name="solo", assets=verl_assets, workdir=root / "solo", address=dep.address,
                            opted_out=True)
        out["solo"] = _run(solo, None, harness_events)
        muxed = MultiNodeJob(name=JOB, assets=verl_assets, workdir=root / "mux", address=dep.address)
        opt_in = {env.SIDECAR_SOCKET: dep.sockets["n0"], env.EVENT_LOG: str(root / "phases.jsonl"), env.JOB: JOB,
                  adapter_env.SLO: "4", adapter_env.PHASE_S: "2,1"}  # the driver runs on the head, n0
        out["mux"] = _run(muxed, opt_in, harness_events)
        out["left"] = [j.job for j in cluster_jobs(dep)]
    out["node_events"] = read_jsonl(dep.node_events)
    out["phases"] = read_jsonl(root / "phases.jsonl")
    out["harness"] = read_jsonl(harness_events)
    figures = {w: {"wall_s": round(out[w]["t1"] - out[w]["t0"], 1), "peak_rss_gib": round(out[w]["peak_rss"] / 2**30, 2)}
               for w in ("solo", "mux")}
    (root / "figures.json").write_text(json.dumps(figures))
    print(f"\nmulti-node veRL runs: {figures}")
    yield out
    for j in ("solo", "mux"):
        shutil.rmtree(out[j]["job"].ray_tmp(), ignore_errors=True)


@pytest.fixture(scope="module")
def verl_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from assets import build

    return build(tmp_path_factory.mktemp("assets"))


def _run(job: MultiNodeJob, opt_in: dict[str, str] | None, marker: Path) -> dict[str, Any]:
    """Run the job to its end; also samples the summed RSS of the cluster's processes (those whose
    environment names `marker`, the raylets' harness event file) and the driver, for the figures."""
    t0 = time.time()
    proc = job.start(opt_in)
    peak = 0
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            peak = max(peak, rss_bytes(marker, proc.pid))
            time.sleep(1.0)
        rc = proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"job": job, "rc": rc, "t0": t0, "t1": time.time(), "log": job.workdir / "job.log", "peak_rss": peak}


def rss_bytes(marker: Path, driver: int) -> int:
    """Summed resident memory of `driver` and every process whose environment contains `marker` (shared
    pages counted once per process: an upper bound)."""
    needle, total = str(marker).encode(), 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                ours = int(d) == driver or needle in f.read()
            if ours:
                with open(f"/proc/{d}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            continue
    return total


def _during(runs: dict[str, Any], which: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = runs[which]
    return [x for x in rows if r["t0"] <= float(x.get("t", 0)) <= r["t1"]]


def test_the_cluster_has_three_nodes_and_both_runs_finish(runs: dict[str, Any]) -> None:
    assert sorted(runs["ray_nodes"]) == ["n0", "n1", "n2"]
    for which in ("solo", "mux"):
        assert runs[which]["rc"] == 0, f"{which} run failed; see {runs[which]['log']}"
    assert JOB not in runs["left"], "the finished job was not deregistered"


def test_each_replica_server_runs_on_its_workers_node(runs: dict[str, Any]) -> None:
    for which in ("solo", "mux"):
        rows = _during(runs, which, runs["harness"])
        servers = {r["node"] for r in rows if r["kind"] == "server.init"}
        workers = {r["node"] for r in rows if r["kind"] == "worker.update_weights"}
        assert servers == workers == set(GPU_NODES), (which, servers, workers)


def gpu_pids(runs: dict[str, Any]) -> dict[str, set[int]]:
    """Node -> pids of the opted-in run's processes that would hold GPU memory (the harness's own record)."""
    out: dict[str, set[int]] = defaultdict(set)
    for r in _during(runs, "mux", runs["harness"]):
        if r["kind"] in ("server.init", "worker.update_weights"):
            out[r["node"]].add(r["pid"])
    return out


def attached_pids(runs: dict[str, Any]) -> dict[str, set[int]]:
    """Node -> pids the node's own sidecar attached as ranks of the job (SO_PEERCRED)."""
    out: dict[str, set[int]] = defaultdict(set)
    for r in runs["node_events"]:
        if r.get("event") == "rank_attached" and r.get("job") == JOB:
            out[r["node"]].add(r["pid"])
    return out


def test_every_gpu_process_is_a_rank_on_its_own_nodes_sidecar(runs: dict[str, Any]) -> None:
    gpu, attached = gpu_pids(runs), attached_pids(runs)
    assert set(gpu) == set(GPU_NODES), gpu
    for node in GPU_NODES:
        assert len(gpu[node]) == 2, f"expected one FSDP worker and one rollout server on {node}: {gpu[node]}"
        assert gpu[node] <= attached[node], f"GPU processes on {node} that are no rank there: {gpu[node] - attached[node]}"
    everywhere = [p for n in attached for p in attached[n]]
    assert len(everywhere) == len(set(everywhere)), f"a process attached on two nodes: {dict(attached)}"
    assert not set().union(*gpu.values()) & attached.get("n0", set()), "a GPU process attached on the head"


def test_every_phase_is_granted_and_released_on_each_nodes_own_sidecar(runs: dict[str, Any]) -> None:
    for event in ("granted", "released"):
        seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for r in runs["node_events"]:
            if r.get("event") == event and r.get("job") == JOB:
                seen[r["node"]].append((r["phase"], r["iteration"]))
        assert {n: seen.get(n) for n in GPU_NODES} == dict.fromkeys(GPU_NODES, PHASES), (event, dict(seen))
        assert "n0" not in seen, f"the head's sidecar {event} a phase of the job: {seen['n0']}"


def test_ranks_on_each_node_hold_that_nodes_permit_and_it_covers_exactly_the_attach_nodes(runs: dict[str, Any]) -> None:
    """Every rank holds every phase on its node, under a permit (epoch) its own node's sidecar granted; I1
    in this layout: every permit covers exactly the nodes the job's GPU ranks attached on."""
    rank_phases = [r for r in runs["phases"] if r.get("event") == "rank_phase" and r.get("job") == JOB]
    attach = {r["node"] for r in runs["phases"] if r.get("event") == "rank_attached" and r.get("job") == JOB}
    assert attach == set(GPU_NODES), attach  # the adapter's GPU ranks (the TaskRunner's own rank is not one)
    for node in GPU_NODES:
        ranks = len({r["pid"] for r in runs["phases"] if r.get("event") == "rank_attached" and r["node"] == node})
        held = [(r["phase"], r["iteration"]) for r in rank_phases if r["node"] == node and r["epoch"] > 0]
        assert sorted(held) == sorted(PHASES * ranks), (node, held)
        granted = {(r["phase"], r["iteration"], r["epoch"]) for r in runs["node_events"]
                   if r.get("event") == "granted" and r.get("job") == JOB and r["node"] == node}
        assert {(r["phase"], r["iteration"], r["epoch"]) for r in rank_phases if r["node"] == node} <= granted
    assert {tuple(r["nodes"]) for r in rank_phases} == {GPU_NODES}
    entered = [r for r in runs["phases"] if r.get("event") == "ranks_entered" and r.get("job") == JOB]
    assert [(r["phase"], r["iteration"]) for r in entered] == PHASES
    assert {tuple(r["nodes"]) for r in entered} == {GPU_NODES}, [r["nodes"] for r in entered]
    assert {tuple(r["placement"].get("train", ())) for r in entered} == {GPU_NODES}


def held_by_node(runs: dict[str, Any], phase: str) -> dict[str, list[tuple[float, float]]]:
    """Node -> (granted, released) times of the job's `phase` permits, as that node's own sidecar logged them."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    granted: dict[tuple[str, int], float] = {}
    for r in runs["node_events"]:
        if r.get("job") != JOB or r.get("phase") != phase:
            continue
        if r["event"] == "granted":
            granted[(r["node"], r["iteration"])] = r["t"]
        elif r["event"] == "released":
            out[r["node"]].append((granted.pop((r["node"], r["iteration"])), r["t"]))
    return out


def test_rollout_requests_run_only_inside_a_rollout_permit_on_their_node(runs: dict[str, Any]) -> None:
    """A rank enters a phase only once its node's permit is granted: every generate call on a node falls
    between that node's sidecar granting a rollout and releasing it."""
    held = held_by_node(runs, "rollout")
    assert sorted(held) == list(GPU_NODES) and all(len(v) == 2 for v in held.values()), held
    generated = [r for r in _during(runs, "mux", runs["harness"]) if r["kind"] == "server.generate"]
    assert generated
    pid_node = {p: n for n, pids in gpu_pids(runs).items() for p in pids}
    assert {pid_node.get(g["pid"]) for g in generated} == set(GPU_NODES), "both replicas generate"
    outside = [(pid_node.get(g["pid"]), g["start"]) for g in generated
               if not any(a <= g["start"] and g["end"] <= b for a, b in held[pid_node.get(g["pid"], "")])]
    assert not outside, f"generate calls outside a rollout permit on their node: {outside[:5]}"


def test_per_step_metrics_equal_the_solo_run(runs: dict[str, Any]) -> None:
    from job import step_metrics

    alone, muxed = step_metrics(runs["solo"]["log"]), step_metrics(runs["mux"]["log"])
    assert sorted(alone) == sorted(muxed) == [1, 2]
    for step in alone:
        keys = [k for k in alone[step] if k in KEYS or (k.startswith("actor/") and not k.startswith("actor/perf"))]
        assert {"critic/score/mean", "training/rollout_probs_diff_max"} <= set(keys), keys
        for key in keys:
            assert math.isclose(alone[step][key], muxed[step][key], rel_tol=1e-3,
                                abs_tol=NOISE_KEYS_ABS_TOL.get(key, 1e-6)), (step, key, alone[step][key],
                                                                              muxed[step][key])
