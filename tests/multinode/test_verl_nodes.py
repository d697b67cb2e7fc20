"""Real veRL 0.9.1 GRPO with ``trainer.nnodes=2`` (one fake GPU per node) on a real 3-raylet Ray cluster,
with one real sidecar per node on a real coordinator (Redis): once alone (RollMux off in its workers), once
opted in and multiplexed with a cheap side job (two plain shim processes, one per GPU node, packed on the
same nodes). One module-scoped run of each; every test asserts on their logs.

What the run shows (docs: DESIGN.md "Where a job runs"):
* I3: every process of the job that would hold GPU memory (the FSDP ``WorkerDict`` actors and the
  rollout servers, pinned per node) is a rank on its own node's sidecar;
* each node's permit is granted and released on that node's own sidecar, every phase;
* no rollout request is served on a node outside a rollout permit held there;
* I1 for this layout: the permit's nodes are the nodes the ranks attached on;
* each FSDP rank trains on the same samples as in the solo run, every step's metrics equal the solo run's,
  and every step's rollout ran on the latest weights;
* mutual exclusion between the two jobs on each node;
* the memory check (sidecars read per-PID GPU bytes from the named stand-in provider, ``--gpu-memory-standin``):
  a side rank that keeps memory holds its own node until it frees it, or until the wait ends (the event
  names its PID), and only that node;
* SIGKILL of the side job's rank on n2 mid-phase: n2 is freed only when its lease lapses, n1 only once its own
  rank released; the veRL job finishes;
* a job whose rank attaches outside its placement is refused, the error naming both node sets (I4).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from deployment import cluster_jobs, multinode
from verl_nodes import (
    FREE_AFTER_S,
    KEEP_BYTES,
    MEMORY_WAIT_S,
    SIDE,
    MultiNodeJob,
    SideRun,
    raylet_env,
    run_side,
)

from rollmux.adapters.common import env as adapter_env
from rollmux.shim import env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOB = "mnjob"
GPU_NODES = ("n1", "n2")
KEYS = ("actor/pg_loss", "critic/score/mean", "training/rollout_probs_diff_max")
NOISE_KEYS_ABS_TOL = {"training/rollout_probs_diff_max": 5e-5}  # fp32 reduction-order noise (test_multiplex.py)
PHASES = [(p, i) for i in range(2) for p in ("rollout", "train", "sync")]
LEASE_TTL_S = 10.0


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    from job import read_jsonl as read

    return read(path)


@pytest.fixture(scope="module")
def runs(verl_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mn")
    harness_events = root / "harness.jsonl"
    out: dict[str, Any] = {"root": root}
    standin = root / "standin"  # per-PID GPU bytes the sidecars read (the named stand-in for NVML)
    standin.mkdir()
    with multinode(root / "dep", raylet_env=raylet_env(harness_events), lease_ttl_s=LEASE_TTL_S,
                   sidecar_args=("--gpu-memory-standin", str(standin), "--memory-wait-s", str(MEMORY_WAIT_S))) as dep:
        out["ray_nodes"] = dep.ray.alive()
        solo = MultiNodeJob(name="solo", assets=verl_assets, workdir=root / "solo", address=dep.address,
                            opted_out=True)
        out["solo"] = _run(solo, None, harness_events)
        muxed = MultiNodeJob(name=JOB, assets=verl_assets, workdir=root / "mux", address=dep.address)
        opt_in = {env.SIDECAR_SOCKET: dep.sockets["n0"], env.EVENT_LOG: str(root / "phases.jsonl"), env.JOB: JOB,
                  adapter_env.SLO: "4", adapter_env.PHASE_S: "2,1"}  # the driver runs on the head, n0
        side = out["side"] = SideRun()
        driver = threading.Thread(target=run_side, args=(dep, root / "side", standin, JOB, side), daemon=True)
        driver.start()
        out["mux"] = _run(muxed, opt_in, harness_events)
        driver.join(120)
        out["left"] = [j.job for j in cluster_jobs(dep)]
        if side.token:  # it stays registered after its rank died (parked): its owner removes it
            _operator(dep).job(SIDE, side.token).deregister()
        out["stray"] = _stray(dep)
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


def _operator(dep: Any) -> Any:
    from rollmux.wire.auth import operator_token
    from rollmux.wire.client import CoordinatorClient

    return CoordinatorClient(dep.coordinator.address, token=operator_token(dep.secret_file.read_text()))


def _stray(dep: Any) -> dict[str, Any]:
    """Register a small job, then attach a rank of it on a node outside its placement: (placement, refusal)."""
    import grpc

    from rollmux.core.model import JobSpec
    from rollmux.proto import sidecar_v1_pb2 as spb
    from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc

    client = _operator(dep)
    job = client.register_job(JobSpec(name="stray", n_rollout_gpus=1, n_train_gpus=1, t_roll_s=0.5, t_train_s=0.5,
                                      slo=10.0, rollout_state_bytes=1 << 20, train_state_bytes=1 << 20))
    info = job.status()
    placed = (*info.rollout_nodes, *info.train_nodes)
    outside = next(n for n in sorted(dep.sockets) if n not in placed)
    with grpc.insecure_channel(f"unix:{dep.sockets[outside]}") as channel:
        stream = spb_grpc.SidecarStub(channel).Attach(spb.AttachRequest(job="stray", job_token=str(job.token),
                                                                          rank=0, pid=os.getpid()), timeout=30)
        try:
            first = next(stream)
            refusal = None, f"attached: {first}"
        except grpc.RpcError as exc:
            refusal = exc.code(), exc.details()
    job.deregister()
    client.close()
    return {"state": info.state, "placed": placed, "outside": outside, "code": refusal[0], "details": refusal[1]}


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


ON_POLICY_PROBS_DIFF_MAX = 1e-3
"""Rollout log-probs against the trainer's for the same tokens: float noise is ~1e-4; a rollout on weights one
update behind (lr 1e-2) is far above."""


def rank_batches(runs: dict[str, Any], which: str) -> list[tuple[int, tuple[str, ...]]]:
    """(data-parallel rank, the samples it trained on in their order) of each FSDP update of a run, sorted
    (the harness's ``train.batch`` events: a hash of each sample's token ids)."""
    rows = _during(runs, which, [r for r in runs["harness"] if r["kind"] == "train.batch"])
    return sorted((r["rank"], tuple(r["rows"])) for r in rows)


def test_each_rank_trains_on_the_samples_it_trained_on_alone(runs: dict[str, Any]) -> None:
    """Which FSDP rank trains on which sample is the same in both runs: the harness orders a training batch
    by its prompts' dataloader order (``rollmux_verl_cpu._batch_order``); in the order the two rollout
    replicas finished it varied run to run, and with it the gradient (bf16 compute) and step 2's tokens."""
    alone, muxed = rank_batches(runs, "solo"), rank_batches(runs, "mux")
    assert len(alone) == 4 and {rank for rank, _ in alone} == {0, 1}, alone  # 2 steps x 2 ranks
    assert alone == muxed


def test_per_step_metrics_equal_the_solo_run_and_every_step_is_on_policy(runs: dict[str, Any]) -> None:
    """Every step of the multiplexed run equals the solo run's (as on one node,
    ``tests/adapters/verl/test_multiplex.py``), and every step's rollout ran on the latest weights."""
    from job import step_metrics

    alone, muxed = step_metrics(runs["solo"]["log"]), step_metrics(runs["mux"]["log"])
    assert sorted(alone) == sorted(muxed) == [1, 2]
    for step in alone:
        keys = [k for k in alone[step] if k in KEYS or (k.startswith("actor/") and not k.startswith("actor/perf"))]
        assert {"critic/score/mean", "training/rollout_probs_diff_max", "actor/grad_norm"} <= set(keys), keys
        for key in keys:
            assert math.isclose(alone[step][key], muxed[step][key], rel_tol=1e-3,
                                abs_tol=NOISE_KEYS_ABS_TOL.get(key, 1e-6)), (step, key, alone[step][key], muxed[step][key])
    for run, metrics in (("solo", alone), ("mux", muxed)):
        for step in (1, 2):
            assert metrics[step]["training/rollout_probs_diff_max"] <= ON_POLICY_PROBS_DIFF_MAX, (run, step)


# ------------------------------------------------------------------------------ the side job beside it
def side_events(runs: dict[str, Any], event: str, job: str = SIDE) -> list[dict[str, Any]]:
    return [r for r in runs["node_events"] if r.get("event") == event and r.get("job") == job]


def holds(runs: dict[str, Any], job: str) -> dict[str, list[tuple[float, float, int]]]:
    """Node -> (granted, ended, epoch) of each permit of `job` there, as that node's sidecar logged it
    (ended: its release there, or the revocation that fenced it)."""
    ends: dict[tuple[str, int], float] = {}
    for r in runs["node_events"]:
        if r.get("job") == job and r.get("event") in ("released", "revoked"):
            ends.setdefault((r["node"], r["epoch"]), r["t"])
    out: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for r in side_events(runs, "granted", job):
        out[r["node"]].append((r["t"], ends.get((r["node"], r["epoch"]), math.inf), r["epoch"]))
    return out


def test_the_side_job_ran_between_the_verl_jobs_phases_on_the_same_nodes(runs: dict[str, Any]) -> None:
    side = runs["side"]
    assert not side.error, side.error
    assert side.rcs == {"n1": 0, "n2": -9}, side.rcs
    ours, theirs = holds(runs, SIDE), holds(runs, JOB)
    assert set(ours) == set(theirs) == set(GPU_NODES), (dict(ours), dict(theirs))
    for node in GPU_NODES:
        first, last = min(t for t, _, _ in theirs[node]), max(e for _, e, _ in theirs[node])
        assert any(first < t < last for t, _, _ in ours[node]), f"the side job never ran inside the veRL run on {node}"
        # one phase per node at a time (the sidecars' own log lines: 0.25 s for their order across processes)
        clash = [(a, b) for a in ours[node] for b in theirs[node] if min(a[1], b[1]) - max(a[0], b[0]) > 0.25]
        assert not clash, f"both jobs held {node} at once: {clash}"


def released_at(runs: dict[str, Any], phase: str, iteration: int) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in side_events(runs, "released") if (r["phase"], r["iteration"]) == (phase, iteration)}


def test_a_rank_that_keeps_gpu_memory_holds_only_its_own_node_until_it_frees_it(runs: dict[str, Any]) -> None:
    """Rollout(0): the keeper on n1 frees its bytes FREE_AFTER_S after the phase; n1 goes back once it did,
    n2 (whose rank freed everything) at once."""
    rel, keeper = released_at(runs, "rollout", 0), runs["side"].pids["n1"]
    assert set(rel) == set(GPU_NODES), rel
    held_s = rel["n1"]["t"] - rel["n2"]["t"]
    assert 0.7 * FREE_AFTER_S <= held_s < MEMORY_WAIT_S, held_s
    assert rel["n1"]["gpu_bytes"] == {str(keeper): 0}, rel["n1"]  # released once the bytes came down
    assert not [r for r in side_events(runs, "gpu_memory_not_freed") if r["t"] < rel["n1"]["t"]]


def test_a_rank_that_keeps_gpu_memory_past_the_wait_is_reported_by_pid_and_only_its_node_waits(
        runs: dict[str, Any]) -> None:
    """Train(0): the keeper keeps its bytes past the sidecars' memory wait: n1 goes back when the wait
    ends, reported by PID and bytes; n2 at once."""
    rel, keeper = released_at(runs, "train", 0), runs["side"].pids["n1"]
    assert set(rel) == set(GPU_NODES), rel
    assert rel["n1"]["t"] - rel["n2"]["t"] >= 0.9 * MEMORY_WAIT_S
    assert rel["n1"]["gpu_bytes"] == {str(keeper): KEEP_BYTES}, rel["n1"]  # released anyway when the wait ended
    (report,) = side_events(runs, "gpu_memory_not_freed")
    assert (report["node"], report["pid"], report["used_bytes"]) == ("n1", keeper, KEEP_BYTES), report
    assert report["waited_s"] >= MEMORY_WAIT_S
    assert not [r for r in runs["node_events"] if r.get("event") == "gpu_memory_not_freed" and r.get("job") == JOB]


def test_a_rank_killed_mid_phase_frees_its_node_at_the_lapse_and_the_other_node_after_its_own_release(
        runs: dict[str, Any]) -> None:
    side = runs["side"]
    assert side.killed_at, side.error
    (granted,) = [r for r in side_events(runs, "granted") if (r["node"], r["phase"], r["iteration"]) == ("n2", "sync", 0)]
    epoch = granted["epoch"]
    aborted = [r for r in side_events(runs, "job_aborted") if r["node"] == "n2"]
    assert aborted and aborted[0]["pid"] == side.pids["n2"] and aborted[0]["t"] >= side.killed_at - 0.1, aborted
    lapsed = [r for r in side_events(runs, "revoked") if r["epoch"] == epoch]
    assert [r["node"] for r in lapsed] == ["n2"], lapsed  # fenced on the dead rank's node alone
    lapse_s = lapsed[0]["t"] - side.killed_at
    assert LEASE_TTL_S - 1.5 <= lapse_s <= LEASE_TTL_S + 5.0, lapse_s
    (n1_release,) = [r for r in side_events(runs, "released") if r["node"] == "n1" and r["epoch"] == epoch]
    assert side.killed_at < n1_release["t"] < lapsed[0]["t"], (side.killed_at, n1_release["t"], lapsed[0]["t"])
    after = [r for r in side_events(runs, "granted", JOB) if r["t"] > side.killed_at]
    assert after, "the veRL job had no phase left after the kill"
    assert min(r["t"] for r in after) >= lapsed[0]["t"] - 0.25, "n2 went to the veRL job before the dead rank's lease lapsed"
    assert runs["mux"]["rc"] == 0


def test_a_rank_attached_outside_its_jobs_placement_is_refused_naming_both_node_sets(runs: dict[str, Any]) -> None:
    stray = runs["stray"]
    assert stray["state"] == "admitted" and stray["code"] is not None, stray
    assert stray["outside"] not in stray["placed"]
    assert all(n in stray["details"] for n in (*stray["placed"], stray["outside"])), stray["details"]
