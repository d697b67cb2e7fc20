"""Fuzz every sidecar RPC with Hypothesis against a real sidecar and a real coordinator (secret set).

Each generated call must answer with a deliberate status (never UNKNOWN or INTERNAL); a call the
sidecar refuses must leave both the sidecar's rank leases and the coordinator's stored state as
they were; and a well-behaved job still runs to completion afterwards. Calls that legitimately
end the fixture job (an accepted Attach whose stream then closes, a Detach with job_done) are
followed by a fresh fixture job. The outcome table is printed (`pytest -s`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import strategies as st

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import ClusterSpec, JobSpec, Phase, Pool
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc
from rollmux.sidecar.agent import AgentConfig, NodeAgent
from rollmux.sidecar.gpu import NoGpuProvider
from rollmux.sidecar.server import serve
from rollmux.wire import auth
from rollmux.wire.client import CoordinatorClient, NodeSession
from rollmux.wire.errors import ServiceError
from tests.proto_fuzz import FuzzTarget, fuzz_each_rpc, message

from .test_agent import Rank

SECRET = "fuzz-secret"
EXAMPLES = 250


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)


class Env:
    """A secured coordinator, the rollout node r0's real sidecar, a training node, and a fixture job
    whose one local rank holds its Rollout(0) permit."""

    def __init__(self, sockdir: Path) -> None:
        self.srv = ThreadedServer(ServerOptions(secret=SECRET, http=None, cluster=ClusterSpec(gpus_per_node=1),
                                                config=ServiceConfig(lease_ttl_s=120.0, max_wait_s=0.3,
                                                                     heartbeat_interval_s=5.0)))
        assert self.srv.wait_ready(10)
        self.op = CoordinatorClient(self.srv.address, token=auth.operator_token(SECRET), retry_s=5.0)
        self.agent = NodeAgent(AgentConfig(node_id="r0", pool=Pool.ROLLOUT, heartbeat_s=0.2),
                               CoordinatorClient(self.srv.address, retry_s=5.0), NoGpuProvider("H20", 1),
                               node_token=auth.node_token(SECRET, "r0")).start()
        assert self.agent.wait_connected(30)
        # The training node holds a real stream, as its sidecar would (a node is READY only with one).
        self.t0 = NodeSession(self.op, "t0", Pool.TRAIN, gpu_type="H800", gpu_count=1, host_dram_bytes=1 << 40,
                              token=auth.node_token(SECRET, "t0"), heartbeat_s=0.05).start()
        assert self.t0.connected.wait(10)
        deadline = time.monotonic() + 10
        while not any(n.node_id == "t0" and n.state == "ready" for n in self.op.cluster_state().nodes):
            assert time.monotonic() < deadline, "t0 did not turn ready"
            time.sleep(0.02)
        self.socket = str(sockdir / "r0.sock")
        self.server = serve(self.agent, self.socket, max_workers=128)
        self.channel = grpc.insecure_channel(f"unix:{self.socket}")
        self.stub = spb_grpc.SidecarStub(self.channel)
        self.jobs = 0
        self.rank: Rank | None = None
        self.new_job()

    def new_job(self) -> None:
        if self.jobs:  # the owner of the job that ended cleans up what the sidecar left at the coordinator
            with contextlib.suppress(ServiceError):  # already deregistered by the sidecar
                self.op.job(self.job, self.token).deregister()
        self.jobs += 1
        self.job = f"fz{self.jobs}"
        self.token = self.op.register_job(spec(self.job)).token
        self.rank = Rank(self.socket, self.job, self.token, 0)
        self.epoch = self.rank.acquire("rollout", 0).epoch  # the one job on r0: granted at once

    def fixture_alive(self) -> bool:
        snap = self.agent.snapshot()
        rank = snap["ranks"].get(self.rank.rank_id if self.rank else "")
        job = snap["jobs"].get(self.job)
        return (rank is not None and rank[2] not in ("dead", "detached") and job is not None and job[3] is None
                and self.job in self.srv.core.rt.state.jobs)

    def settle(self, rank_id: str, job: str) -> None:
        """Wait until the sidecar has handled the death of `rank_id` (its job aborted on this node, or
        forgotten here with its last local rank; it stays registered until its owner deregisters it)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            snap = self.agent.snapshot()
            rank, local = snap["ranks"].get(rank_id), snap["jobs"].get(job)
            if rank is not None and rank[2] == "dead" and (local is None or local[3] is not None):
                break
            time.sleep(0.01)
        time.sleep(0.05)

    def state(self) -> tuple[dict[str, Any], dict[str, str]]:
        agent = {k: v for k, v in self.agent.snapshot().items() if k != "connection"}  # may reconnect under load
        return agent, self.srv.run(lambda: self.srv.core.rt.records())  # type: ignore[return-value]

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)
        self.agent.stop()
        self.t0.stop()
        self.op.close()
        self.srv.stop()


@pytest.fixture
def env(sockdir: Path) -> Iterator[Env]:
    e = Env(sockdir)
    yield e
    e.close()


def requests(env: Env) -> dict[str, st.SearchStrategy[Any]]:
    rank_id = st.one_of(st.builds(lambda: env.rank.rank_id if env.rank else ""), st.just("fz1/0#1"))
    common = {"rank_id": rank_id, "job": st.builds(lambda: env.job), "job_token": st.builds(lambda: env.token),
              "phase": st.sampled_from([pb.PHASE_ROLLOUT, pb.PHASE_TRAIN, pb.PHASE_SYNC]),
              "iteration": st.sampled_from([0, 1]),
              "timeout_s": st.floats(0.01, 0.5), "epoch": st.builds(lambda: env.epoch),
              "duration_s": st.floats(0.0, 0.5), "state_host_bytes": st.sampled_from([0, 1 << 20]),
              "finished": st.just(3), "total": st.just(4), "rank": st.just(1), "pid": st.just(os.getpid())}
    spec_hints = {"name": st.sampled_from(["sx1", "sx2"]), "n_rollout_gpus": st.just(1), "n_train_gpus": st.just(1),
                  "slo": st.floats(1.0, 3.0), "t_roll_s": st.floats(1.0, 100.0), "t_train_s": st.floats(1.0, 100.0),
                  "model_params_b": st.floats(0.5, 70.0), "max_tokens": st.sampled_from([1024, 8192]),
                  "batch_size": st.sampled_from([64, 256]), "turns": st.just(1),
                  "rollout_state_bytes": st.just(1 << 20), "train_state_bytes": st.just(1 << 20),
                  "nonce": st.sampled_from(["n1", "n2"])}
    return {
        "Attach": message(spb.AttachRequest, common),
        "Acquire": message(spb.AcquireRequest, common),
        "Release": message(spb.ReleaseRequest, common),
        "Progress": message(spb.ProgressRequest, common),
        "Detach": message(spb.DetachRequest, common),
        "NodeStatus": message(spb.NodeStatusRequest),
        "Register": message(spb.RegisterRequest, spec_hints),
    }


def call(env: Env, rpc: str, request: Any) -> tuple[grpc.StatusCode, Any]:
    try:
        if rpc == "Attach":
            stream = env.stub.Attach(request)  # no deadline: a deadline would end the lease it opens
            first = next(stream)
            stream.cancel()  # the new rank "dies": its job is aborted (an accepted call's effect)
            env.settle(first.attached.rank_id, request.job)
            return grpc.StatusCode.OK, first
        return grpc.StatusCode.OK, getattr(env.stub, rpc)(request, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


def test_fuzz_every_sidecar_rpc(env: Env) -> None:
    def after(rpc: str, request: Any, code: grpc.StatusCode, answer: Any) -> None:
        if code is grpc.StatusCode.OK and rpc == "Register":  # its owner cleans up: no node held for a TTL
            env.op.job(answer.job, answer.job_token).deregister()
        env.srv.run(lambda: env.srv.core.rt.check_invariants())
        if not env.fixture_alive():
            env.new_job()

    fuzz_each_rpc(FuzzTarget(strategies=requests(env), call=lambda rpc, request, _data: call(env, rpc, request),
                             state=env.state, after=after), examples=EXAMPLES, title="sidecar fuzz")
    print(f"fixture jobs used: {env.jobs}")
    # a well-behaved job afterwards: two iterations through the same sidecar
    env.rank.stub.Detach(spb.DetachRequest(rank_id=env.rank.rank_id, job_done=True), timeout=10)
    token = env.op.register_job(spec("good")).token
    rank = Rank(env.socket, "good", token, 0)
    for it in range(2):
        lease = rank.acquire("rollout", it)
        assert rank.release(lease.epoch).node_released
        nxt = CoordinatorClient(env.srv.address).job("good", token)
        for phase in ("train", "sync"):  # the training node has no sidecar: the job drives it directly
            p = nxt.acquire(Phase(phase), it, timeout_s=30)
            nxt.release(p, 0.01)
    assert CoordinatorClient(env.srv.address).job("good", token).status().next_iteration == 2
