"""Live relocation and learning against the real services: a real redis-server, the real coordinator
process (`rollmux coordinator --redis`), real node streams, and in the end-to-end case real sidecars
and the real tiny GRPO job processes.

Scenario (as in test_relocation_runtime): A and B cannot share a training node (their training
state fills its host DRAM), so B opens g1; C packs with A in g0. When A leaves, C alone holds g0
and the coordinator directs it to g1, which frees g0's nodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.core.model import JobSpec, Phase, Pool, RelocationState
from rollmux.core.ports import free_port
from rollmux.testing.chaos.procs import CoordinatorProcess, RedisProcess
from rollmux.wire.client import CoordinatorClient, JobClient

from .conftest import add_node, close_node_streams

PY = sys.executable
TB = 10**12
pytestmark = pytest.mark.usefixtures("redis_server")


class Coordinator(CoordinatorProcess):
    """The coordinator process, restartable in one call."""

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def make_coordinator(redis_server: RedisProcess, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[Coordinator] = []

    def make(*flags: str) -> Coordinator:
        c = Coordinator(redis_server.url, tmp_path, instance_id="reloc",
                        extra=["--lease-ttl", "2.0", "--heartbeat-interval", "0.3", *flags])
        c.start()
        made.append(c)
        return c

    yield make
    close_node_streams()
    for c in made:
        c.kill()


def spec(name: str, train_state: int, *, gpus: int = 8, t_s: float = 10.0) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=gpus, n_train_gpus=gpus, t_roll_s=t_s, t_train_s=t_s, slo=3.0,
                   model_params_b=0.001, rollout_state_bytes=1 << 20, train_state_bytes=train_state)


def three_jobs(client: CoordinatorClient, dram: int, **kw: float) -> dict[str, JobClient]:
    jobs = {n: client.register_job(spec(n, s, **kw)) for n, s in  # type: ignore[arg-type]
            (("A", int(0.6 * dram)), ("B", int(0.6 * dram)), ("C", 1 << 20))}
    assert [jobs[n].status().group_id for n in "ABC"] == ["g0", "g1", "g0"]
    return jobs


def wait_for(what: str, cond, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def run_phase(job: JobClient, seconds: float = 0.0) -> tuple[Phase, int]:
    info = job.status()
    permit = job.acquire(info.next_phase, info.next_iteration, timeout_s=30)
    time.sleep(seconds)
    job.release(permit, seconds)
    return permit.phase, permit.iteration


def four_nodes(client: CoordinatorClient) -> None:
    for i in range(2):
        add_node(client, f"r{i}", Pool.ROLLOUT, host_dram_bytes=TB)
        add_node(client, f"t{i}", Pool.TRAIN, host_dram_bytes=TB)


def groups(client: CoordinatorClient) -> dict[str, list[str]]:
    return {g.group_id: list(g.jobs) for g in client.cluster_state().groups}


def test_a_coordinator_restart_between_directive_and_ack_neither_loses_nor_repeats_the_move(make_coordinator) -> None:
    coord = make_coordinator("--no-learning")
    client = CoordinatorClient(coord.address, retry_s=30.0)
    four_nodes(client)
    jobs = three_jobs(client, TB)
    jobs["A"].deregister()
    directive = wait_for("a directive", lambda: jobs["C"].status().relocation)
    assert (directive.to_group, directive.state) == ("g1", RelocationState.PENDING)

    coord.restart()  # SIGKILL: the directive must come back from Redis
    again = wait_for("the reloaded directive", lambda: jobs["C"].status().relocation)
    assert (again.epoch, again.state) == (directive.epoch, RelocationState.PENDING)
    assert groups(client) == {"g0": ["C"], "g1": ["B"]}

    wait_for("C's lease", lambda: jobs["C"].status().permit_state in ("expired", "queued", "granted"))
    while jobs["C"].status().next_phase is not Phase.SYNC:  # Rollout(0), Train(0)
        run_phase(jobs["C"])
    info = jobs["C"].status()
    permit = jobs["C"].acquire(info.next_phase, info.next_iteration, timeout_s=30)
    rec, note = jobs["C"].ack_relocation(directive.epoch)  # holding Sync(0): not a boundary
    assert rec.state is RelocationState.PENDING and "boundary" in note
    jobs["C"].release(permit, 0.0)
    rec, _ = jobs["C"].ack_relocation(directive.epoch)
    assert rec.state is RelocationState.SWITCHED and (rec.rollout_nodes, rec.train_nodes) == (("r1",), ("t1",))

    coord.restart()  # after the switch, before the job moves on: still one move
    rec2, note = jobs["C"].ack_relocation(directive.epoch)
    assert rec2.state is RelocationState.SWITCHED and rec2.switched_epoch == rec.switched_epoch, note
    assert groups(client) == {"g1": ["B", "C"]}
    nodes = {n.node_id: n.group_id for n in client.cluster_state().nodes}
    assert nodes["r0"] == nodes["t0"] == ""  # g0's nodes released
    assert run_phase(jobs["C"]) == (Phase.ROLLOUT, 1)  # iteration count kept, now on r1
    assert jobs["C"].status().rollout_nodes == ("r1",)
    client.close()


def test_a_directive_not_honoured_in_time_expires_and_the_job_keeps_its_place(make_coordinator) -> None:
    coord = make_coordinator("--no-learning", "--relocation-deadline", "1.5")
    client = CoordinatorClient(coord.address, retry_s=30.0)
    four_nodes(client)
    jobs = three_jobs(client, TB)
    jobs["A"].deregister()
    directive = wait_for("a directive", lambda: jobs["C"].status().relocation)
    expired = wait_for("the directive to expire", lambda: (r := jobs["C"].status().relocation)
                       and r.state is RelocationState.EXPIRED and r, timeout_s=10)
    assert expired.epoch == directive.epoch
    assert groups(client) == {"g0": ["C"], "g1": ["B"]}
    assert jobs["C"].ack_relocation(directive.epoch)[0].state is RelocationState.EXPIRED
    assert [run_phase(jobs["C"]) for _ in range(3)] == [(Phase.ROLLOUT, 0), (Phase.TRAIN, 0), (Phase.SYNC, 0)]
    assert jobs["C"].status().group_id == "g0"
    client.close()


def test_learning_updates_the_profile_from_releases_and_keeps_it_over_a_restart(make_coordinator) -> None:
    coord = make_coordinator("--no-regroup")
    client = CoordinatorClient(coord.address, retry_s=30.0)
    four_nodes(client)
    job = client.register_job(spec("L", 1 << 20))
    assert job.status().learned == (0.0, 0.0, 0.0)
    for _ in range(5):
        for seconds in (0.2, 0.1, 0.02):
            run_phase(job, seconds)
    roll, train, solo = job.status().learned
    assert roll == pytest.approx(0.2, abs=0.1) and 0.0 < train < 1.0
    assert solo < 1.0  # the SLO is judged against the measured solo iteration, not the planned 10 + 10 s
    coord.restart()
    assert wait_for("the reloaded profile", lambda: job.status().learned) == (roll, train, solo)
    client.close()


# ------------------------------------------------------------------------------------------------
# end to end: real sidecars and the real tiny GRPO job processes
# ------------------------------------------------------------------------------------------------

def start_sidecars(procs, coord: Coordinator, sockdir: Path, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    for node, pool in (("r0", "rollout"), ("r1", "rollout"), ("t0", "train"), ("t1", "train")):
        procs.spawn(node, ["-m", "rollmux", "sidecar", "--coordinator", coord.address, "--node-id", node,
                           "--pool", pool, "--socket", str(sockdir / f"{node}.sock"), "--no-nvml",
                           "--heartbeat-s", "0.2", "--event-log", str(workdir / "nodes.jsonl"),
                           "--ready-file", str(workdir / f"{node}.ready")], log=workdir / f"{node}.log")
    for node in ("r0", "r1", "t0", "t1"):
        wait_for(f"sidecar {node}", lambda n=node: (workdir / f"{n}.ready").exists(), timeout_s=120)


def launch_tiny(procs, name: str, token: str, nodes: tuple[str, str], iterations: int, sockdir: Path,  # type: ignore[no-untyped-def]
                workdir: Path) -> list[subprocess.Popen[bytes]]:
    from rollmux.shim import env

    init = f"tcp://127.0.0.1:{free_port()}"
    out = []
    for rank, node in ((0, nodes[1]), (1, nodes[0])):  # rank 0 trains, rank 1 rolls out
        extra = {env.SIDECAR_SOCKET: str(sockdir / f"{node}.sock"), env.JOB: name, env.JOB_TOKEN: token,
                 env.RANK: str(rank), env.EVENT_LOG: str(workdir / "phases.jsonl"),
                 env.SIDECAR_SOCKET_TEMPLATE: str(sockdir / "{node}.sock")}
        argv = ["-m", "rollmux.demo.tiny_grpo.rollmux_rank", "--rank", str(rank), "--init-method", init,
                "--job-id", name, "--iterations", str(iterations), "--prompts", "4", "--group-size", "4",
                "--max-new-tokens", "6", "--minibatches", "1", "--checkpoint-dir", str(workdir)]
        if rank == 0:
            argv += ["--log-file", str(workdir / f"{name}.jsonl")]
        out.append(procs.spawn(f"{name}-r{rank}", argv, log=workdir / f"{name}-r{rank}.log", extra_env=extra))
    return out


def run_direct(job: JobClient, name: str, log: list[tuple[str, str, float, float]], *, stop: threading.Event | None = None,
               phases: int = 0, seconds: float = 0.05) -> None:
    """A job driven from the test: short phases (until `stop`, or `phases` of them), logging
    (job, node, start, end) of each lease for the mutual-exclusion check."""
    done = 0
    while not (stop is not None and stop.is_set()) and (stop is not None or done < phases):
        info = job.status()
        permit = job.acquire(info.next_phase, info.next_iteration, timeout_s=60)
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        log += [(name, n, start, end) for n in permit.nodes]
        job.release(permit, end - start)
        done += 1


def read_jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_a_job_relocated_by_the_live_service_keeps_its_iterations_and_order_and_frees_the_nodes(
        make_coordinator, tmp_path: Path) -> None:
    """C runs as the real tiny GRPO job (two rank processes behind real sidecars); A and B are driven
    from the test, so the schedule does not depend on how fast C's processes start: A holds r0 until
    both of C's ranks have attached and waits for C's first phase; then A and C take turns on g0
    (C's next Rollout follows A's), A leaves after its second iteration,
    and C is directed to g1 with iterations still to run."""
    from rollmux.demo.launch import Procs
    from rollmux.sidecar.gpu import host_dram_bytes

    coord = make_coordinator("--no-learning", "--gpus-per-node", "1")
    client = CoordinatorClient(coord.address, retry_s=30.0)
    procs = Procs(cwd=tmp_path)
    sockdir = Path(tempfile.mkdtemp(prefix="rmx-"))  # short path: sun_path is 107 bytes
    stop, direct_log = threading.Event(), []  # type: ignore[var-annotated]
    try:
        start_sidecars(procs, coord, sockdir, tmp_path)
        jobs = three_jobs(client, host_dram_bytes(), gpus=1, t_s=1.0)
        b = threading.Thread(target=run_direct, args=(jobs["B"], "B", direct_log), kwargs={"stop": stop}, daemon=True)
        b.start()
        iterations = 8
        with jobs["A"].hold(Phase.ROLLOUT, 0, timeout_s=30) as held:  # r0 stays A's until C is up
            start = time.time()
            ranks = launch_tiny(procs, "C", jobs["C"].token, ("r0", "t0"), iterations, sockdir, tmp_path)
            wait_for("C's two ranks to attach", lambda: sum(e.get("event") == "rank_attached" and e.get("job") == "C"
                                                            for e in read_jsonl(tmp_path / "nodes.jsonl")) >= 2,
                     timeout_s=180)
            assert not held.lost.is_set()
        direct_log += [("A", n, start, time.time()) for n in held.permit.nodes]
        wait_for("C's first phase on g0", lambda: any(e.get("job") == "C" and e.get("owner")
                                                       for e in read_jsonl(tmp_path / "phases.jsonl")), timeout_s=60)
        assert groups(client) == {"g0": ["A", "C"], "g1": ["B"]}
        run_direct(jobs["A"], "A", direct_log, phases=5)  # Train(0) .. Sync(1): C takes its turns between them
        jobs["A"].deregister()
        switched = wait_for("C to be switched to g1", lambda: (r := jobs["C"].status().relocation)
                            and r.state is RelocationState.SWITCHED and r, timeout_s=180)
        assert switched.to_group == "g1" and groups(client) == {"g1": ["B", "C"]}  # one group fewer
        nodes = {n.node_id: n for n in client.cluster_state().nodes}
        assert nodes["r0"].group_id == nodes["t0"].group_id == "" and nodes["r0"].holder is None
        for p in ranks:
            assert p.wait(180) == 0, (tmp_path / "C-r0.log").read_text()[-2000:]
    finally:
        stop.set()
        procs.terminate()
        client.close()

    trained = read_jsonl(tmp_path / "C.jsonl")
    assert [r["iteration"] for r in trained] == list(range(iterations))  # every iteration once, in order
    events = read_jsonl(tmp_path / "phases.jsonl")
    moved = [e for e in events if e.get("event") == "relocated" and e["job"] == "C"]
    assert {(e["rank"], e["from_node"], e["node"]) for e in moved} == {(0, "t0", "t1"), (1, "r0", "r1")}
    owned = sorted((e for e in events if e.get("job") == "C" and e.get("owner")), key=lambda e: e["t_start"])
    order = [(e["phase"], e["iteration"]) for e in owned]
    assert order == [(ph, it) for it in range(iterations) for ph in ("rollout", "train", "sync")][:len(order)]
    assert len(order) == 3 * iterations - 1  # the last Sync has no next rollout to feed (job.py's loop)
    switch_at = min(e["t"] for e in moved)
    before = {e["node"] for e in owned if e["t_end"] < switch_at}
    after = {e["node"] for e in owned if e["t_start"] > switch_at}
    assert before == {"r0", "t0"} and after == {"r1", "t1"}
    leases = [(e["job"], e["node"], e["t_start"], e["t_end"]) for e in events if e.get("owner")] + direct_log
    for i, (j1, n1, s1, e1) in enumerate(leases):  # never two jobs on one node at once
        for j2, n2, s2, e2 in leases[i + 1:]:
            assert not (n1 == n2 and j1 != j2 and s1 < e2 and s2 < e1), (j1, j2, n1)


def test_the_service_counts_directives_by_outcome(coordinator, client: CoordinatorClient) -> None:
    four_nodes(client)
    jobs = three_jobs(client, TB)
    counter = coordinator.core.metrics.relocations
    jobs["A"].deregister()
    directive = wait_for("a directive", lambda: jobs["C"].status().relocation)
    assert counter.labels(outcome="issued")._value.get() == 1
    for _ in range(3):
        run_phase(jobs["C"])
    assert jobs["C"].ack_relocation(directive.epoch)[0].state is RelocationState.SWITCHED
    assert counter.labels(outcome="switched")._value.get() == 1
    assert counter.labels(outcome="expired")._value.get() == 0
