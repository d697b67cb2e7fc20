"""Fuzz every coordinator RPC with Hypothesis against the real gRPC server (bootstrap secret set).

Each generated call must answer with a deliberate status (never UNKNOWN or INTERNAL); a refused
call must leave the stored state exactly as it was; the invariants hold after every call; and a
well-behaved job still runs to completion afterwards. The outcome table is printed (`pytest -s`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import strategies as st

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Phase, Pool
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
from rollmux.wire import auth
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import ServiceError
from tests.proto_fuzz import FuzzTarget, fuzz_each_rpc, message

from .conftest import add_node, job_spec

SECRET = "fuzz-secret"
EXAMPLES = 300
NODES = {"r0": Pool.ROLLOUT, "r1": Pool.ROLLOUT, "t0": Pool.TRAIN, "d0": Pool.TRAIN}
HOSTS = ("r0", "r1", "t0")
"""r0, r1, t0 host the jobs; d0 is the node fuzzed calls may drain and stream for."""


class Env:
    """A secured coordinator with four nodes and one admitted job "fz" holding its Rollout(0) lease."""

    def __init__(self) -> None:
        self.srv = ThreadedServer(ServerOptions(secret=SECRET, http=None, config=ServiceConfig(
            lease_ttl_s=120.0, max_wait_s=0.2, reap_interval_s=0.05, heartbeat_interval_s=0.5)))
        assert self.srv.wait_ready(10)
        self.op = CoordinatorClient(self.srv.address, token=auth.operator_token(SECRET), retry_s=5.0)
        self.op.register_node("d0", NODES["d0"], gpu_type="H800", gpu_count=8, host_dram_bytes=2 * 10**12,
                              token=auth.node_token(SECRET, "d0"))
        # The job's nodes hold real streams, as their sidecars would (a node is READY only with one).
        self.sessions = [add_node(self.op, node, NODES[node], token=auth.node_token(SECRET, node))
                         for node in HOSTS]
        self.fz = self.op.register_job(job_spec("fz"))
        self.fz.acquire(Phase.ROLLOUT, 0, timeout_s=5)
        self.channel = grpc.insecure_channel(self.srv.address, options=[("grpc.max_send_message_length", 64 << 20)])
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.accepted_jobs: dict[str, str] = {}  # name -> token of jobs a fuzzed RegisterJob created

    def records(self) -> dict[str, str]:
        return self.srv.run(lambda: self.srv.core.rt.records())  # type: ignore[return-value]

    def check_invariants(self) -> None:
        self.srv.run(lambda: self.srv.core.rt.check_invariants())

    def epoch(self) -> int:
        permit = self.srv.core.rt.state.permits.get("fz")
        return permit.epoch if permit is not None else 0

    def wait_streams_closed(self) -> None:
        deadline = time.monotonic() + 5
        while self.srv.run(lambda: bool(set(self.srv.core.rt.liveness.connected) - set(HOSTS))) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.02)

    def close(self) -> None:
        for session in self.sessions:
            session.stop()
        self.channel.close()
        self.op.close()
        self.srv.stop()


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


OPERATOR_RPCS = {"RegisterJob", "GetClusterState", "DrainNode", "RemoveJob"}
NODE_RPCS = {"RegisterNode", "NodeStream"}


def tokens(env: Env, rpc: str) -> st.SearchStrategy[str | None]:
    """Half the time the credential the RPC wants (so its deeper checks run), else any other."""
    if rpc in OPERATOR_RPCS:
        right = auth.operator_token(SECRET)
    elif rpc in NODE_RPCS:
        right = auth.node_token(SECRET, "d0")
    else:
        right = env.fz.token
    anything = st.sampled_from([None, "", "garbage", "x" * 5000, auth.operator_token(SECRET),
                                auth.node_token(SECRET, "d0"), auth.node_token(SECRET, "r0"), env.fz.token])
    return st.one_of(st.just(right), anything)


def requests(env: Env) -> dict[str, st.SearchStrategy[Any]]:
    """Per RPC, a strategy of its request with hints toward the live job, nodes and epoch."""
    jobs = st.sampled_from(["fz", "fz", "fz", "ghost", "fz2"])
    epoch = st.builds(env.epoch)
    common = {"job": jobs, "epoch": epoch, "timeout_s": st.floats(0.0, 0.3), "duration_s": st.floats(0.0, 0.5),
              "phase": st.sampled_from([pb.PHASE_ROLLOUT, pb.PHASE_TRAIN, pb.PHASE_SYNC]),
              "iteration": st.sampled_from([0, 1])}
    node_ids = st.sampled_from(["d0", "d0", "d0", "n-new", "r0"])
    spec_hints = {"name": st.sampled_from(["fz2", "fz3"]), "n_rollout_gpus": st.just(8), "n_train_gpus": st.just(8),
                  "slo": st.floats(1.0, 3.0), "t_roll_s": st.floats(1.0, 100.0), "t_train_s": st.floats(1.0, 100.0),
                  "model_params_b": st.floats(0.5, 70.0), "max_tokens": st.sampled_from([1024, 8192]),
                  "batch_size": st.sampled_from([64, 256]), "turns": st.just(1),
                  "rollout_state_bytes": st.just(10**9), "train_state_bytes": st.just(10**9),
                  "nonce": st.sampled_from(["n1", "n2"])}
    return {
        "RegisterNode": message(pb.RegisterNodeRequest, {"node_id": node_ids, "gpu_type": st.just("H800"),
                                                         "pool": st.just(pb.POOL_TRAIN), "gpu_count": st.just(8),
                                                         "host_dram_bytes": st.just(10**12)}),
        "RegisterJob": message(pb.RegisterJobRequest, {**spec_hints, "relay_node": st.sampled_from(["", "", "", "d0"])}),
        "GetJob": message(pb.GetJobRequest, common),
        "AcquirePermit": message(pb.AcquirePermitRequest, common),
        "RenewPermit": message(pb.RenewPermitRequest, common),
        "ReleasePermit": message(pb.ReleasePermitRequest, common),
        "AdvancePermit": message(pb.AdvancePermitRequest, common),
        "ReportProgress": message(pb.ReportProgressRequest, {**common, "finished": st.just(3), "total": st.just(4)}),
        "DeregisterJob": message(pb.DeregisterJobRequest, {"job": st.sampled_from(["ghost", "fz2"])}),
        "GetClusterState": message(pb.ClusterStateRequest),
        "DrainNode": message(pb.DrainNodeRequest, {"node_id": st.sampled_from(["d0", "nope"])}).filter(
            lambda r: r.node_id not in ("r0", "r1", "t0")),
        "RemoveJob": message(pb.RemoveJobRequest, {"job": st.sampled_from(["ghost", "fz3"])}).filter(
            lambda r: r.job != "fz"),
        "NodeStream": message(pb.NodeUp, {"active_epochs": epoch}),
    }


def call(env: Env, rpc: str, request: Any, token: str | None, node_md: str) -> tuple[grpc.StatusCode, Any]:
    md = [] if token is None else [("authorization", f"Bearer {token}")]
    try:
        if rpc == "NodeStream":
            stream = env.stub.NodeStream(iter([request, request]), metadata=[*md, ("x-rollmux-node", node_md)],
                                         timeout=5)
            return grpc.StatusCode.OK, list(stream)
        return grpc.StatusCode.OK, getattr(env.stub, rpc)(request, metadata=md, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


def test_fuzz_every_coordinator_rpc(env: Env) -> None:
    def call_one(rpc: str, request: Any, data: st.DataObject) -> tuple[grpc.StatusCode, Any]:
        token = data.draw(tokens(env, rpc), label="token")
        node_md = data.draw(st.sampled_from(["d0", "", "zz", "a b", "x" * 200]), label="node")
        code, answer = call(env, rpc, request, token, node_md)
        if rpc == "NodeStream":
            env.wait_streams_closed()
        return code, answer

    def after(rpc: str, request: Any, code: grpc.StatusCode, answer: Any) -> None:
        if code is grpc.StatusCode.OK and rpc == "RegisterJob":
            env.accepted_jobs[request.spec.name] = answer.job_token
        env.check_invariants()

    fuzz_each_rpc(FuzzTarget(strategies=requests(env), call=call_one, state=env.records, after=after),
                  examples=EXAMPLES, title="coordinator fuzz")
    # the owners of the jobs that fuzzing created (and of fz) clean up; then a well-behaved job runs
    for name, token in env.accepted_jobs.items():
        with contextlib.suppress(ServiceError):  # already removed by a fuzzed DeregisterJob/RemoveJob
            env.op.job(name, token).deregister()
    if "fz" in env.srv.core.rt.state.jobs:
        env.fz.deregister()
    good = env.op.register_job(job_spec("good"))
    permit = good.acquire(Phase.ROLLOUT, 0, timeout_s=30)
    for _ in range(5):  # Rollout(0) .. Sync(1)
        permit = good.advance(permit, duration_s=0.01, timeout_s=30)
    good.release(permit, 0.01)
    assert good.status().next_iteration == 2
    env.check_invariants()
