"""The real gRPC server on the embedded store and on Redis: API, refusals, auth, streams, probes."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Lease, NodeEvent, Phase, Pool
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.wire.auth import node_token, operator_token
from rollmux.wire.client import CoordinatorClient, NodeSession, PermitTimeoutError
from rollmux.wire.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    StaleEpochError,
    UnauthenticatedError,
)

from .conftest import FAST, add_node, add_nodes, close_node_streams, job_spec


def stored(srv: ThreadedServer) -> dict[str, str]:
    return srv.call(srv.core.store.load())


BAD_REQUESTS = [
    ("RegisterJob", pb.RegisterJobRequest(), InvalidArgumentError, "spec is missing"),
    ("RegisterJob", pb.RegisterJobRequest(spec=pb.JobSpec(name="x", n_rollout_gpus=-8, n_train_gpus=8)),
     InvalidArgumentError, "n_rollout_gpus"),
    ("RegisterJob", pb.RegisterJobRequest(spec=pb.JobSpec(name="a b", n_rollout_gpus=8, n_train_gpus=8)),
     InvalidArgumentError, "spec.name"),
    ("RegisterJob", pb.RegisterJobRequest(spec=pb.JobSpec(name="x" * 500, n_rollout_gpus=8, n_train_gpus=8)),
     InvalidArgumentError, "spec.name"),
    ("RegisterNode", pb.RegisterNodeRequest(node_id="n", pool=pb.POOL_ROLLOUT, gpu_type="H20", gpu_count=0,
                                            host_dram_bytes=1), InvalidArgumentError, "gpu_count"),
    ("RegisterNode", pb.RegisterNodeRequest(node_id="n", gpu_type="H20", gpu_count=8, host_dram_bytes=1),
     InvalidArgumentError, "pool"),
    ("RegisterNode", pb.RegisterNodeRequest(node_id="r0", pool=pb.POOL_TRAIN, gpu_type="H20", gpu_count=8,
                                            host_dram_bytes=1), AlreadyExistsError, "r0"),
    ("RegisterNode", pb.RegisterNodeRequest(node_id="n", pool=pb.POOL_ROLLOUT, gpu_type="H20", gpu_count=8,
                                            host_dram_bytes=1, nvml={f"k{i}": "x" * 40_000 for i in range(40)}),
     InvalidArgumentError, "over the 1048576-byte limit: field nvml"),
    ("DrainNode", pb.DrainNodeRequest(node_id="nope"), NotFoundError, "nope"),
    ("RemoveJob", pb.RemoveJobRequest(job="nope"), NotFoundError, "nope"),
    ("GetJob", pb.GetJobRequest(job="nope"), UnauthenticatedError, "nope"),  # authenticated before lookup
]


@pytest.mark.parametrize("method,request_,error,needle", BAD_REQUESTS,
                         ids=[f"{m}-{e.__name__}-{i}" for i, (m, _, e, _n) in enumerate(BAD_REQUESTS)])
def test_bad_requests_are_refused_and_leave_the_store_unchanged(client, coordinator, method, request_, error,
                                                                needle) -> None:
    add_nodes(client, 1, 1)
    client.register_job(job_spec("a"))
    before = stored(coordinator)
    with pytest.raises(error, match=needle):
        client.call(method, request_)
    assert stored(coordinator) == before


def test_job_calls_refuse_bad_phases_epochs_and_foreign_tokens(client, coordinator) -> None:
    add_nodes(client, 2, 2)
    a = client.register_job(job_spec("a"))
    b = client.register_job(job_spec("b", slo=1.0))
    pa = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
    before = stored(coordinator)
    with pytest.raises(FailedPreconditionError, match="out of order"):
        a.acquire(Phase.SYNC, 0, timeout_s=1)
    with pytest.raises(InvalidArgumentError, match="iteration"):
        a.call_ = a._call("AcquirePermit", pb.AcquirePermitRequest(job="a", phase=pb.PHASE_ROLLOUT, iteration=-1))
    with pytest.raises(InvalidArgumentError, match="epoch"):
        a._call("ReleasePermit", pb.ReleasePermitRequest(job="a", epoch=-3))
    with pytest.raises(InvalidArgumentError, match="duration_s"):
        a._call("ReleasePermit", pb.ReleasePermitRequest(job="a", epoch=pa.epoch, duration_s=-1))
    with pytest.raises(StaleEpochError):
        a._call("ReleasePermit", pb.ReleasePermitRequest(job="a", epoch=pa.epoch + 100))
    intruder = client.job("a", b.token)  # b's token on a's permit
    with pytest.raises(PermissionDeniedError, match="own permits"):
        intruder.release(pa, 1.0)
    with pytest.raises(UnauthenticatedError):
        client.job("a", "").renew(pa)
    with pytest.raises(grpc.RpcError) as info:  # over the 4 MiB message limit
        client._stub().RegisterJob(pb.RegisterJobRequest(spec=pb.JobSpec(name="big"), nonce="x" * (5 << 20)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stored(coordinator) == before
    a.release(pa, 0.5)


def test_waiting_acquire_is_granted_as_soon_as_the_node_is_released(client, coordinator) -> None:
    add_nodes(client, 2, 1)
    a = client.register_job(job_spec("a", nr=16))
    b = client.register_job(job_spec("b", nr=8))
    assert a.registration.group_id == b.registration.group_id
    pa = a.acquire(Phase.ROLLOUT, 0)
    with pytest.raises(PermitTimeoutError, match="held by job 'a'|behind job"):
        b.acquire(Phase.ROLLOUT, 0, timeout_s=0.2)
    got: dict[str, float] = {}

    def wait_b() -> None:
        pb_ = b.acquire(Phase.ROLLOUT, 0, timeout_s=10)
        got["t"] = time.monotonic()
        got["epoch"] = pb_.epoch

    t = threading.Thread(target=wait_b)
    t.start()
    time.sleep(0.3)
    released = time.monotonic()
    a.release(pa, 0.3)
    t.join(10)
    assert got["epoch"] > pa.epoch
    assert got["t"] - released < 1.0  # pushed by the server, not polled


def test_node_stream_receives_grants_and_a_snapshot_on_reconnect(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    msgs: list[NodeEvent] = []
    session = NodeSession(client, "r0", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=2 * 10**12,
                          on_message=msgs.append, heartbeat_s=0.1).start()
    try:
        assert session.connected.wait(5)
        job = client.register_job(job_spec("a"))
        p = job.acquire(Phase.ROLLOUT, 0, timeout_s=5)
        deadline = time.monotonic() + 5
        while not any(isinstance(m, Lease) for m in msgs) and time.monotonic() < deadline:
            time.sleep(0.02)
        granted = [m for m in msgs if isinstance(m, Lease)]
        assert granted and granted[0].epoch == p.epoch and granted[0].job == "a"
        state = client.cluster_state()
        assert [n.connected for n in state.nodes if n.node_id == "r0"] == [True]
    finally:
        session.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if [n.state for n in client.cluster_state().nodes if n.node_id == "r0"] == ["lost"]:
            break
        time.sleep(0.02)
    assert [n.state for n in client.cluster_state().nodes if n.node_id == "r0"] == ["lost"]


def test_probes_and_metrics(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    job = client.register_job(job_spec("a"))
    job.release(job.acquire(Phase.ROLLOUT, 0), 0.1)
    port = coordinator.running.http_port
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/livez").status == 200
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    assert 'rollmux_permits_granted_total{pool="rollout"}' in text
    assert "rollmux_grant_latency_seconds_bucket" in text
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(coordinator.address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="rollmux.v1.Coordinator"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_secret_enables_node_and_operator_tokens() -> None:
    srv = ThreadedServer(ServerOptions(config=FAST, http=None, secret="s3cret"))
    try:
        assert srv.wait_ready()
        anon = CoordinatorClient(srv.address, retry_s=1)
        with pytest.raises(UnauthenticatedError):
            anon.cluster_state()
        with pytest.raises(PermissionDeniedError):
            anon.register_node("r0", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=10**12,
                               token=node_token("s3cret", "r1"))
        anon.register_node("r0", Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=10**12,
                           token=node_token("s3cret", "r0"))
        op = CoordinatorClient(srv.address, retry_s=1, token=operator_token("s3cret"))
        assert [n.node_id for n in op.cluster_state().nodes] == ["r0"]
        with pytest.raises(UnauthenticatedError):
            anon.register_job(job_spec("a"))
        for node_id, pool in (("r0", Pool.ROLLOUT), ("t0", Pool.TRAIN)):  # their streams, with node tokens
            add_node(op, node_id, pool, host_dram_bytes=10**12, token=node_token("s3cret", node_id))
        job = op.register_job(job_spec("a"))
        job.release(job.acquire(Phase.ROLLOUT, 0, timeout_s=5), 0.1)  # the job token, not the operator's
    finally:
        close_node_streams()
        srv.stop()


def test_registration_retry_with_the_same_nonce_is_idempotent(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    first = client.register_job(job_spec("a"), nonce="n-1")
    again = client.register_job(job_spec("a"), nonce="n-1")
    assert again.registration.group_id == first.registration.group_id
    with pytest.raises(AlreadyExistsError):
        client.register_job(job_spec("a"), nonce="other")
    again.release(again.acquire(Phase.ROLLOUT, 0, timeout_s=5), 0.1)  # the rotated token works
    with pytest.raises(PermissionDeniedError):
        first.status()


def test_readyz_fails_while_the_store_is_down() -> None:
    from rollmux.coordinator.service.store import EmbeddedStore

    store = EmbeddedStore()
    srv = ThreadedServer(ServerOptions(config=FAST, http="127.0.0.1:0", leader_ttl_s=0.3), store)
    try:
        assert srv.wait_ready()
        port = srv.running.http_port
        store.available = False
        deadline = time.monotonic() + 5
        code = 200
        while time.monotonic() < deadline and code == 200:
            try:
                code = urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status
            except urllib.error.HTTPError as exc:
                code = exc.code
            time.sleep(0.05)
        assert code == 503
        store.available = True
        assert srv.wait_ready(5)
    finally:
        srv.stop()


def test_advance_permit_releases_and_returns_the_next_grant(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    a = client.register_job(job_spec("a", slo=1.0))
    p = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
    seen = [(p.phase, p.iteration)]
    for _ in range(4):
        p = a.advance(p, duration_s=0.5, timeout_s=5)
        seen.append((p.phase, p.iteration))
    assert seen == [(Phase.ROLLOUT, 0), (Phase.TRAIN, 0), (Phase.SYNC, 0), (Phase.ROLLOUT, 1), (Phase.TRAIN, 1)]
    assert f'"epoch":{p.epoch}' in stored(coordinator)["permit/a"]  # the returned grant is durable
    before = stored(coordinator)
    with pytest.raises(StaleEpochError):
        a._call("AdvancePermit", pb.AdvancePermitRequest(job="a", epoch=p.epoch + 7, duration_s=1.0))
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        a._call("AdvancePermit", pb.AdvancePermitRequest(job="a", epoch=p.epoch, timeout_s=float("nan")))
    assert stored(coordinator) == before
    assert a.release(p, 1.0) == (Phase.SYNC, 1)  # the old two-call API still works beside it


def test_advance_permit_with_a_node_id_releases_that_node_and_waits_for_the_others(client) -> None:
    import threading

    add_nodes(client, 2, 1)
    a = client.register_job(job_spec("a", nr=16))
    p = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
    assert sorted(p.nodes) == ["r0", "r1"]
    got: dict[str, object] = {}
    waiter = threading.Thread(target=lambda: got.update(next=a.advance(p, 0.5, timeout_s=10, node_id="r0")))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive(), "the next phase came before r1 released the rollout"
    assert holder_of(client, "r0") == "" and holder_of(client, "r1") == "a"
    assert a.release(p, 0.5, node_id="r1") == (Phase.TRAIN, 0)
    waiter.join(10)
    nxt = got["next"]
    assert (nxt.phase, nxt.iteration, nxt.nodes) == (Phase.TRAIN, 0, ("t0",))  # type: ignore[attr-defined]


def holder_of(client, node_id: str) -> str:  # type: ignore[no-untyped-def]
    node = next(n for n in client.cluster_state().nodes if n.node_id == node_id)
    return node.holder.job if node.holder is not None else ""
