"""One path, against the real services (real redis-server, real gRPC, real node streams): the live
coordinator grants in the order the policy plans, lending an idle node to a waiting job whose turn
it is not (differential test against the model), places on
the nodes it really has (drain), admits without head-of-line blocking, and counts a node READY only
while its stream is connected."""

from __future__ import annotations

import threading
import time

import pytest

from rollmux.coordinator.policy.intra_group import MemberTiming, simulate_round_robin
from rollmux.core.model import Phase, Pool
from rollmux.wire.client import CoordinatorClient, JobClient, NodeSession, PermitTimeoutError
from rollmux.wire.errors import InvalidArgumentError

from .conftest import add_node, add_nodes, job_spec, node_state

redis_only = pytest.mark.parametrize("coordinator", ["redis"], indirect=True)
SCALE = 1 / 250  # real seconds per planned second
ITERATIONS = 3


def run_job(job: JobClient, plan: dict[Phase, float], log: list[tuple[str, Phase, int, float, float]],
            go: threading.Event) -> None:
    """Run ITERATIONS iterations, each phase sleeping its planned time; log (job, phase, it, start, end)."""
    go.wait()
    for it in range(ITERATIONS):
        for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):
            permit = job.acquire(phase, it, timeout_s=30)
            start = time.monotonic()
            time.sleep(plan[phase])
            end = time.monotonic()
            log.append((job.name, phase, it, start, end))
            job.release(permit, end - start)
    job.deregister()


@redis_only
def test_differential_the_service_grants_as_the_model_plans(client: CoordinatorClient, coordinator) -> None:
    # The case: A 12+10 s and B 100+100 s in one group on separate rollout nodes (each node's
    # host DRAM holds one job's rollout state). The model puts B's Train(0) before A's Train(1).
    for node_id in ("r0", "r1"):
        add_node(client, node_id, Pool.ROLLOUT, host_dram_bytes=int(1.5e9))
    add_node(client, "t0", Pool.TRAIN)
    a = client.register_job(job_spec("A", t_roll_s=12, t_train_s=10, slo=10.0))
    b = client.register_job(job_spec("B", t_roll_s=100, t_train_s=100, slo=2.0))
    ra, rb = a.status(), b.status()
    assert ra.group_id == rb.group_id and {ra.rollout_nodes, rb.rollout_nodes} == {("r0",), ("r1",)}
    log: list[tuple[str, Phase, int, float, float]] = []
    go = threading.Event()
    plans = {"A": {Phase.ROLLOUT: 12 * SCALE, Phase.TRAIN: 10 * SCALE, Phase.SYNC: 0.0},
             "B": {Phase.ROLLOUT: 100 * SCALE, Phase.TRAIN: 100 * SCALE, Phase.SYNC: 0.0}}
    threads = [threading.Thread(target=run_job, args=(j, plans[j.name], log, go)) for j in (a, b)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    assert len(log) == 2 * 3 * ITERATIONS, log

    # The model, fed the durations the service really ran (Train + its Sync as one training turn).
    t0 = min(start for *_, start, _end in log)
    got = {(j, ph, it): (start - t0, end - t0) for j, ph, it, start, end in log}
    names = [ra.job, rb.job]

    def phase_time(idx: int, it: int, phase: Phase) -> float:
        j = names[idx]
        if phase is Phase.ROLLOUT:
            s, e = got[(j, Phase.ROLLOUT, it)]
            return e - s
        return got[(j, Phase.SYNC, it)][1] - got[(j, Phase.TRAIN, it)][0]

    members = [MemberTiming(name=n, t_roll_s=0, t_train_s=0, rollout_nodes=s.rollout_nodes)
               for n, s in zip(names, (ra, rb))]
    model = simulate_round_robin(members, iterations=ITERATIONS, phase_time=phase_time, record=True)
    planned = {(iv.job, iv.phase, iv.iteration): iv.start_s for iv in model.intervals}
    model_order = sorted(planned, key=planned.__getitem__)
    served = sorted(((j, ph, it) for j, ph, it in got if ph is not Phase.SYNC), key=lambda k: got[k][0])
    trains = [k for k in served if k[1] is Phase.TRAIN]
    for job in names:  # each job's own order is the model's (one job per rollout node here)
        assert [k for k in served if k[0] == job] == [k for k in model_order if k[0] == job]
    # B's Train(0) is its turn after A's Train(0), but B is still in its Rollout when A asks for
    # Train(1): the idle training node is lent to A (work conservation), the turn stays B's.
    assert [k for k in model_order if k[1] is Phase.TRAIN][:3] == [("A", Phase.TRAIN, 0), ("B", Phase.TRAIN, 0),
                                                                   ("A", Phase.TRAIN, 1)]
    assert trains[:2] == [("A", Phase.TRAIN, 0), ("A", Phase.TRAIN, 1)]
    loan_s = max(phase_time(0, it, Phase.TRAIN) for it in range(ITERATIONS))
    for key, start in planned.items():  # a loan delays the turn's job by at most one borrowed phase
        assert got[key][0] <= start + loan_s + 0.25, (key, got[key][0], start)
    assert got[("A", Phase.TRAIN, 1)][0] < planned[("A", Phase.TRAIN, 1)] - 0.1  # and A ran earlier


@redis_only
def test_drain_a_draining_node_gets_no_new_job_and_an_idle_node_does(client: CoordinatorClient,
                                                                      coordinator) -> None:
    add_nodes(client, 2, 1)
    a = client.register_job(job_spec("a"))
    assert a.status().rollout_nodes == ("r0",)
    assert client.drain_node("r0") == "draining"  # a's Rollout(0) holds it: it finishes there
    b = client.register_job(job_spec("b"))
    info = b.status()
    assert info.state == "admitted" and info.group_id == a.status().group_id and info.rollout_nodes == ("r1",)
    pb_ = b.acquire(Phase.ROLLOUT, 0, timeout_s=5)  # granted on the idle node, not left waiting on r0
    assert pb_.nodes == ("r1",)
    a.release(a.acquire(Phase.ROLLOUT, 0, timeout_s=5), 0.1)
    assert node_state(client, "r0") == "drained"
    assert client.drain_node("t0") == "draining"  # the group's training node: nobody joins the group
    c = client.register_job(job_spec("c", slo=1.0))  # a group of its own needs a free training node: none
    assert c.status().state == "pending"


@redis_only
def test_admission_refuses_what_can_never_fit_and_a_pending_job_blocks_nobody(client: CoordinatorClient,
                                                                             coordinator) -> None:
    add_nodes(client, 1, 1)
    client.register_job(job_spec("a"))
    with pytest.raises(InvalidArgumentError, match="over the limit of 1024 nodes per pool"):
        client.register_job(job_spec("huge", nr=10_000))
    b = client.register_job(job_spec("b", nr=32, slo=1.0))  # could fit once 4 more nodes join
    c = client.register_job(job_spec("c"))  # fits beside a now
    assert b.status().state == "pending" and b.status().pending_position == 1
    assert c.status().state == "admitted"
    with pytest.raises(PermitTimeoutError, match="pending admission"):
        b.acquire(Phase.ROLLOUT, 0, timeout_s=0.3)


@redis_only
def test_a_node_is_ready_only_while_its_stream_is_connected(client: CoordinatorClient, coordinator) -> None:
    with pytest.raises(InvalidArgumentError, match="not in the coordinator's GPU catalog"):
        client.register_node("x", Pool.ROLLOUT, gpu_type="NOPE", gpu_count=8, host_dram_bytes=10**12)
    for node_id, pool, gpu in (("r0", Pool.ROLLOUT, "H20"), ("t0", Pool.TRAIN, "H800")):
        client.register_node(node_id, pool, gpu_type=gpu, gpu_count=8, host_dram_bytes=2 * 10**12)
        assert node_state(client, node_id) == "lost"  # registered, but no sidecar stream
    a = client.register_job(job_spec("a"))
    with pytest.raises(PermitTimeoutError, match="pending admission"):
        a.acquire(Phase.ROLLOUT, 0, timeout_s=0.3)  # no grant on a node that never connected
    r0 = add_node(client, "r0", Pool.ROLLOUT)
    add_node(client, "t0", Pool.TRAIN)
    p = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
    a.release(p, 0.1)
    a.release(a.acquire(Phase.TRAIN, 0, timeout_s=5), 0.1)
    sync = a.acquire(Phase.SYNC, 0, timeout_s=5)
    r0.stop()  # the rollout node's sidecar goes away
    deadline = time.monotonic() + 5
    while node_state(client, "r0") != "lost":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    a.release(sync, 0.1)
    with pytest.raises(PermitTimeoutError, match="r0"):
        a.acquire(Phase.ROLLOUT, 1, timeout_s=0.3)
    again = NodeSession(client, "r0", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12,
                        heartbeat_s=0.2).start()
    try:
        assert a.acquire(Phase.ROLLOUT, 1, timeout_s=5).nodes == ("r0",)
    finally:
        again.stop()
