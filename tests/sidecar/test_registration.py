"""Job registration through the node's sidecar (relayed RegisterJob), against a real coordinator."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import ClusterSpec, JobSpec, Pool
from rollmux.shim import api as shim
from rollmux.shim import env, registration
from rollmux.sidecar.agent import AgentConfig, NodeAgent
from rollmux.sidecar.gpu import NoGpuProvider
from rollmux.sidecar.server import serve
from rollmux.wire import auth
from rollmux.wire.client import CoordinatorClient, NodeSession
from rollmux.wire.errors import ShimConfigError, SidecarUnreachableError

from .conftest import run_python

SECRET = "s3cret-for-tests"


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)


def start_coordinator(**config: object) -> ThreadedServer:
    srv = ThreadedServer(ServerOptions(listen="127.0.0.1:0", http=None, secret=SECRET,
                                       cluster=ClusterSpec(gpus_per_node=1),
                                       config=ServiceConfig(heartbeat_interval_s=0.2, **config)))  # type: ignore[arg-type]
    assert srv.wait_ready(30)
    return srv


class Sidecar:
    def __init__(self, srv: ThreadedServer, sock: str, node_id: str = "r0", *, token: str | None = None,
                 event_log: str | None = None) -> None:
        self.agent = NodeAgent(AgentConfig(node_id=node_id, pool=Pool.ROLLOUT, heartbeat_s=0.2, event_log=event_log),
                               CoordinatorClient(srv.address, retry_s=2.0), NoGpuProvider("H20", 1),
                               node_token=token).start()
        self.server = serve(self.agent, sock)
        self.socket = sock

    def stop(self) -> None:
        self.server.stop(0)
        self.agent.stop()


@pytest.fixture
def secured(sockdir: Path) -> Iterator[tuple[ThreadedServer, Sidecar]]:
    srv = start_coordinator()
    side = Sidecar(srv, str(sockdir / "r0.sock"), token=auth.node_token(SECRET, "r0"),
                   event_log=str(sockdir / "events.jsonl"))
    assert side.agent.wait_connected(30)
    train = NodeSession(operator(srv), "t0", Pool.TRAIN, gpu_type="H800", gpu_count=1, host_dram_bytes=1 << 40,
                        token=auth.node_token(SECRET, "t0"), heartbeat_s=0.2).start()  # so jobs are admitted
    assert train.connected.wait(30)
    yield srv, side
    train.stop()
    side.stop()
    srv.stop()
    registration._clear()


def operator(srv: ThreadedServer) -> CoordinatorClient:
    return CoordinatorClient(srv.address, token=auth.operator_token(SECRET))


def test_register_through_sidecar_records_relaying_node_and_hides_token(secured, caplog) -> None:  # type: ignore[no-untyped-def]
    srv, side = secured
    caplog.set_level(logging.DEBUG)
    reg = shim.register(spec("relayed-a"), socket=side.socket)
    assert reg.job == "relayed-a" and len(reg.token) >= 32 and reg.deployment is None
    assert reg.token not in repr(reg) and reg.token not in str(reg) and "hidden" in repr(reg)
    assert registration.current() == reg
    jobs = {j.job: j for j in operator(srv).cluster_state().jobs}
    assert jobs["relayed-a"].relayed_by == "r0"
    # the token opens the job's own calls at the coordinator
    assert CoordinatorClient(srv.address).job("relayed-a", reg.token).status().job == "relayed-a"
    # and is nowhere in the logs or the sidecar's event log
    assert reg.token not in caplog.text
    assert reg.token not in Path(side.agent.config.event_log or "").read_text()
    assert all(reg.token not in e for e in side.agent.status()["events"])


def test_registered_process_attaches_without_token_variables(secured) -> None:  # type: ignore[no-untyped-def]
    _, side = secured
    code = ("import rollmux\n"
            "from rollmux.core.model import JobSpec\n"
            "reg = rollmux.register(JobSpec(name='relayed-b', n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, "
            "t_train_s=1.0, slo=3.0, rollout_state_bytes=1, train_state_bytes=1))\n"
            "assert rollmux.init() is True\n"
            "with rollmux.phase('rollout') as ctx:\n"
            "    assert ctx.lease.epoch > 0\n"
            "rollmux.shutdown(job_done=True)\n"
            "print('ok', repr(reg))\n")
    res = run_python(code, {env.SIDECAR_SOCKET: side.socket})
    assert res.returncode == 0, res.stderr
    assert "ok Registration(job='relayed-b', token=<hidden>" in res.stdout


def test_init_with_explicit_token_needs_no_variables(secured) -> None:  # type: ignore[no-untyped-def]
    _, side = secured
    reg = shim.register(spec("relayed-c"), socket=side.socket)
    code = ("import rollmux, sys\nassert rollmux.init(job='relayed-c', job_token=sys.stdin.readline().strip())\n"
            "rollmux.shutdown(job_done=True)\nprint('ok')\n")
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(Path(__file__).resolve().parents[2]), env.SIDECAR_SOCKET: side.socket})
    res = subprocess.run([sys.executable, "-c", code], input=reg.token + "\n", env=e, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_sidecar_without_node_token_cannot_relay(secured, sockdir: Path) -> None:  # type: ignore[no-untyped-def]
    srv, _ = secured
    operator(srv).register_node("r9", Pool.ROLLOUT, gpu_type="H20", gpu_count=1, host_dram_bytes=1 << 40,
                                token=auth.node_token(SECRET, "r9"))
    side = Sidecar(srv, str(sockdir / "r9.sock"), "r9", token="not-the-node-token")
    try:
        with pytest.raises(registration.JobRegistrationError, match="PERMISSION_DENIED"):
            shim.register(spec("relayed-d"), socket=side.socket)
        assert "relayed-d" not in {j.job for j in operator(srv).cluster_state().jobs}
    finally:
        side.stop()


def test_operator_can_turn_relayed_registration_off(sockdir: Path) -> None:
    srv = start_coordinator(relayed_registration=False)
    side = Sidecar(srv, str(sockdir / "r0.sock"), token=auth.node_token(SECRET, "r0"))
    try:
        assert side.agent.wait_connected(30)
        with pytest.raises(registration.JobRegistrationError, match="no-relayed-registration"):
            shim.register(spec("relayed-e"), socket=side.socket)
        assert not operator(srv).cluster_state().jobs
        assert operator(srv).register_job(spec("direct-e")).token  # the operator path still works
    finally:
        side.stop()
        srv.stop()


def test_refused_spec_names_the_field(secured) -> None:  # type: ignore[no-untyped-def]
    _, side = secured
    bad = JobSpec(name="relayed-f", n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                  rollout_state_bytes=1 << 45)  # over a node's 2 TB of host DRAM
    with pytest.raises(registration.JobRegistrationError, match="rollout_state_bytes"):
        shim.register(bad, socket=side.socket)


def test_unreachable_sidecar_fails_fast_naming_the_socket(tmp_path: Path) -> None:
    import socket

    missing = str(tmp_path / "nope.sock")
    with pytest.raises(SidecarUnreachableError, match=missing):
        shim.register(spec("x"), socket=missing)
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)  # bound, never listening
    try:
        t = time.monotonic()
        with pytest.raises(SidecarUnreachableError, match=stale):
            shim.register(spec("x"), socket=stale, timeout_s=30.0)
        assert time.monotonic() - t < 5.0, "a dead socket must fail fast, not wait for the timeout"
    finally:
        s.close()
    with pytest.raises(ShimConfigError, match=env.SIDECAR_SOCKET):
        shim.register(spec("x"), socket="")
