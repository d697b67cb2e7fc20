"""Hardening at the sidecar socket, with a real coordinator, a real sidecar and real
processes: another local process cannot end or drive a job's ranks, rank ids are unguessable, and
peers are checked with SO_PEERCRED."""

from __future__ import annotations

import os
import socket
import stat
import time

import grpc
import pytest

from rollmux.core.model import Pool
from rollmux.proto import sidecar_v1_pb2 as spb
from rollmux.proto import sidecar_v1_pb2_grpc as spb_grpc
from rollmux.sidecar.peercred import PeerPolicy
from rollmux.sidecar.server import serve
from rollmux.wire.client import CoordinatorClient

from .conftest import register, run_python
from .test_agent import Rank

ATTACKER = r"""
import sys, grpc
from rollmux.proto import rollmux_v1_pb2 as pb, sidecar_v1_pb2 as spb, sidecar_v1_pb2_grpc as spb_grpc
sock, rank_id = sys.argv[1], sys.argv[2]
stub = spb_grpc.SidecarStub(grpc.insecure_channel("unix:" + sock))
calls = [
    ("Detach", spb.DetachRequest(rank_id=rank_id, job_done=True)),
    ("Detach", spb.DetachRequest(rank_id="victim/0#1", job_done=True)),  # the old, guessable form
    ("Acquire", spb.AcquireRequest(rank_id=rank_id, phase=pb.PHASE_ROLLOUT, iteration=0, timeout_s=1)),
    ("Release", spb.ReleaseRequest(rank_id=rank_id, epoch=1, duration_s=0.1)),
    ("Progress", spb.ProgressRequest(rank_id=rank_id, epoch=1, finished=1, total=2)),
]
for name, req in calls:
    try:
        getattr(stub, name)(req, timeout=10)
        print(name, "OK")
    except grpc.RpcError as e:
        print(name, e.code().name)
"""


def test_another_local_process_cannot_detach_or_drive_a_jobs_rank(coordinator, make_node) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token = register(coordinator, "victim")
    victim = Rank(node.socket, "victim", token, 0)
    assert victim.rank_id.startswith("victim/0#") and len(victim.rank_id) > len("victim/0#1.") + 12
    code = ATTACKER.replace("sys.argv[1], sys.argv[2]", f"{node.socket!r}, {victim.rank_id!r}")
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("FAILED_PRECONDITION") == 5, res.stdout  # every call refused, one answer for all
    assert "OK" not in res.stdout
    # the victim is untouched: still registered, its rank still drives its permits
    assert CoordinatorClient(coordinator.address).job("victim", token).status().job == "victim"
    lease = victim.acquire("rollout", 0)
    assert lease.epoch > 0 and victim.release(lease.epoch).node_released


def test_rank_ids_differ_per_attach_and_are_not_sequential(coordinator, make_node) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    token = register(coordinator, "j")
    ranks = [Rank(node.socket, "j", token, 0) for _ in range(3)]  # kept alive: a dropped rank aborts its job
    ids = {r.rank_id for r in ranks}
    assert len(ids) == 3
    suffixes = {i.rsplit(".", 1)[1] for i in ids}
    assert len(suffixes) == 3 and all(len(s) >= 16 for s in suffixes)


def test_a_call_that_bypasses_the_socket_front_is_refused(coordinator, make_node) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    private = node.server.front.upstream  # type: ignore[attr-defined]
    assert stat.S_IMODE(os.stat(os.path.dirname(private)).st_mode) == 0o700
    channel = grpc.insecure_channel(f"unix:{private}")
    with pytest.raises(grpc.RpcError) as info:
        spb_grpc.SidecarStub(channel).NodeStatus(spb.NodeStatusRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    channel.close()


def _node_status_as(uid: int, sock: str) -> str:
    code = ("import os, grpc\nfrom rollmux.proto import sidecar_v1_pb2 as spb, sidecar_v1_pb2_grpc as spb_grpc\n"
            f"os.setgid({uid}); os.setuid({uid})\n"
            f"stub = spb_grpc.SidecarStub(grpc.insecure_channel('unix:{sock}'))\n"
            "try:\n    print(stub.NodeStatus(spb.NodeStatusRequest(), timeout=5).node_id)\n"
            "except grpc.RpcError as e:\n    print(e.code().name)\n")
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a peer under another uid")
def test_peer_credentials_are_checked_on_every_connection(coordinator, make_node, sockdir) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    os.chmod(sockdir, 0o755)
    os.chmod(node.socket, 0o666)  # the file mode lets anyone connect: SO_PEERCRED is what refuses
    assert _node_status_as(65534, node.socket) == "UNAVAILABLE"
    events = node.agent.status()["events"]
    assert any('"peer_refused"' in e and '"uid": 65534' in e for e in events), events[-3:]
    # allowed explicitly (as --allow-uid does): served
    path = str(sockdir / "allow.sock")
    allowed = serve(node.agent, path, policy=PeerPolicy(uids=frozenset({65534})))
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
        assert _node_status_as(65534, path) == "r0"
    finally:
        allowed.stop(0)


def test_a_flood_of_refused_connections_leaves_the_sidecar_serving(coordinator, make_node) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    socks = []
    for _ in range(50):  # raw connections that never speak HTTP/2
        s = socket.socket(socket.AF_UNIX)
        s.connect(node.socket)
        socks.append(s)
    time.sleep(0.2)
    for s in socks:
        s.close()
    stub = spb_grpc.SidecarStub(grpc.insecure_channel(f"unix:{node.socket}"))
    assert stub.NodeStatus(spb.NodeStatusRequest(), timeout=10).node_id == "r0"
