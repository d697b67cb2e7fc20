"""Rank leases through the real socket service: permit fan-out, release after all local ranks, rank death."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

from rollmux.core.model import Phase, Pool
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc
from rollmux.shim import env
from rollmux.wire import convert
from rollmux.wire.client import CoordinatorClient

from .conftest import REPO, register

WAIT_S = 30.0  # generous: CI machines are shared


class Rank:
    """A rank as the shim sees the sidecar: one Attach stream (the lease) plus unary calls."""

    def __init__(self, socket: str, job: str, token: str, rank: int) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = spb_grpc.SidecarStub(self.channel)
        self.stream = self.stub.Attach(spb.AttachRequest(job=job, job_token=token, rank=rank, pid=os.getpid()))
        self.rank_id = next(self.stream).attached.rank_id

    def acquire(self, phase: str, iteration: int) -> pb.Lease:
        req = spb.AcquireRequest(rank_id=self.rank_id, phase=convert.PHASE_TO_PB[Phase(phase)], iteration=iteration,
                                 timeout_s=WAIT_S)
        return self.stub.Acquire(req, timeout=WAIT_S + 5).lease

    def release(self, epoch: int) -> spb.ReleaseResponse:
        return self.stub.Release(spb.ReleaseRequest(rank_id=self.rank_id, epoch=epoch, duration_s=0.01),
                                 timeout=WAIT_S + 5)


def holder(coordinator, node: str) -> str:  # type: ignore[no-untyped-def]
    for n in CoordinatorClient(coordinator.address).cluster_state().nodes:
        if n.node_id == node:
            return n.holder.job if n.holder is not None else ""
    raise AssertionError(f"node {node} not registered")


def wait_for(pred, what: str, timeout: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_permit_fans_out_to_both_local_ranks_and_node_is_released_after_both(coordinator, make_node) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token = register(coordinator, "job-a")
    a, b = Rank(node.socket, "job-a", token, 0), Rank(node.socket, "job-a", token, 1)

    leases = {}
    threads = [threading.Thread(target=lambda r=r, k=k: leases.__setitem__(k, r.acquire("rollout", 0)))
               for k, r in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert leases["a"].epoch == leases["b"].epoch > 0  # one coordinator permit, fanned out
    assert holder(coordinator, "r0") == "job-a"

    done: dict[str, spb.ReleaseResponse] = {}
    ta = threading.Thread(target=lambda: done.__setitem__("a", a.release(leases["a"].epoch)))
    ta.start()
    time.sleep(0.5)
    assert "a" not in done, "rank a's release returned before rank b released"
    assert holder(coordinator, "r0") == "job-a", "node released with a local rank still running"

    done["b"] = b.release(leases["b"].epoch)
    ta.join(WAIT_S)
    assert done["a"].node_released != done["b"].node_released  # exactly one rank released the node
    assert holder(coordinator, "r0") == ""
    assert {done["a"].next_phase, done["b"].next_phase} >= {pb.PHASE_TRAIN}


RANK_PROC = r"""
import sys, time, rollmux
rollmux.init()
with rollmux.phase("rollout", iteration=0):
    print("running", flush=True)
    time.sleep(600)
"""


def start_rank(socket: str, job: str, token: str, rank: int = 0) -> subprocess.Popen[str]:
    """A real rank process (RANK_PROC) inside Rollout(0) on the sidecar at `socket`, once it printed "running"."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(REPO), env.SIDECAR_SOCKET: socket, env.JOB: job, env.JOB_TOKEN: token,
              env.RANK: str(rank)})
    proc = subprocess.Popen([sys.executable, "-c", RANK_PROC], cwd=REPO, env=e, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"
    return proc


def test_last_rank_detaching_mid_phase_abandons_the_lease(coordinator, make_node) -> None:
    """Found by the sidecar fuzz test: the sidecar kept renewing such a lease forever (node blocked)."""
    node = make_node("r0", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token = register(coordinator, "job-d")
    rank = Rank(node.socket, "job-d", token, 0)
    rank.acquire("rollout", 0)
    rank.stub.Detach(spb.DetachRequest(rank_id=rank.rank_id, job_done=False), timeout=WAIT_S)
    assert "permit_abandoned" in " ".join(node.agent.status()["events"])
    assert node.agent.active_epochs() == []  # heartbeats no longer renew it
    wait_for(lambda: holder(coordinator, "r0") == "", "the abandoned lease to lapse (TTL 5 s)", 15.0)


def test_release_duration_is_capped_by_the_time_the_node_held_the_permit(coordinator, make_node) -> None:
    """Found by the sidecar fuzz test: the coordinator refused an overlong duration after the sidecar
    had already cleared the permit locally; now the sidecar caps it and the release goes through."""
    node = make_node("r0", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token = register(coordinator, "job-c")
    rank = Rank(node.socket, "job-c", token, 0)
    lease = rank.acquire("rollout", 0)
    resp = rank.stub.Release(spb.ReleaseRequest(rank_id=rank.rank_id, epoch=lease.epoch, duration_s=80_000.0),
                             timeout=WAIT_S)
    assert resp.node_released and holder(coordinator, "r0") == ""
    status = CoordinatorClient(coordinator.address).job("job-c", token)
    jobs = {j.job: j for j in CoordinatorClient(coordinator.address).cluster_state().jobs}
    assert status.status().next_phase.value == "train" and jobs["job-c"].observed_roll_s < 10.0


def test_a_rank_attaching_outside_its_jobs_placement_is_refused_naming_both_node_sets(coordinator, make_node) -> None:
    """I4: the job is placed on r0 (and t0); a rank of it attaching on r1 is refused by r1's sidecar with
    the coordinator's coded error, and nothing of the job runs or is held on r1."""
    make_node("r0", Pool.ROLLOUT)
    stray = make_node("r1", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token = register(coordinator, "job-d")
    placed = CoordinatorClient(coordinator.address).job("job-d", token).status().rollout_nodes
    assert placed == ("r0",), placed
    with pytest.raises(grpc.RpcError) as err:
        Rank(stray.socket, "job-d", token, 0)
    details = err.value.details()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("PlacementMismatchError")
    assert "placed on node(s) r0, t0" in details and "attach on node(s) r1" in details
    assert stray.agent.active_epochs() == [] and stray.agent.snapshot()["ranks"] == {}
    assert holder(coordinator, "r1") == ""


