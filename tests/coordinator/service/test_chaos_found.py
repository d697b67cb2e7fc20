"""Defects the chaos benchmark (benchmarks/chaos.py) found, each against the real services:

* a job's first permit, queued behind another job, was not stored: after any reload (restart,
  failover, Redis restart) the admitted job had no permit and waited forever, then answered INTERNAL;
* CoordinatorClient's retry window started when the call did, so a long-polling acquire that lost
  its coordinator after more than `retry_s` of waiting failed at once instead of reaching the standby;
* a leader that lost its leadership without dying (paused, or beaten to it after a Redis restart) kept
  its node streams open as a standby: the sidecars stayed with it and the new leader saw those nodes
  LOST, granting nothing on them, for good;
* turns on the rollout and the training node out of step (a coordinator killed between two of its
  stored writes, a job joining or leaving mid meta-iteration) left two waiting jobs each holding the
  other's turn, and the group stalled for good (`policy.grants.deadlock_edge` now breaks such cycles).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Phase
from rollmux.testing.chaos.procs import CoordinatorProcess, RedisProcess
from rollmux.wire.client import CoordinatorClient

from .conftest import add_nodes, close_node_streams, job_spec


class ReloadingServer:
    """The real server on a real Redis with one rollout and one training node, restartable in one call
    (the state comes back from Redis); `client` talks to the server running now."""

    def __init__(self, redis_server: RedisProcess) -> None:
        self.opts = ServerOptions(redis_url=redis_server.url, http=None,
                                  config=ServiceConfig(lease_ttl_s=30.0, reap_interval_s=0.02, heartbeat_interval_s=0.2))
        self.srv: ThreadedServer | None = None
        self.client: CoordinatorClient | None = None

    def start(self) -> CoordinatorClient:
        self.srv = ThreadedServer(self.opts)
        assert self.srv.wait_ready(10)
        self.client = CoordinatorClient(self.srv.address, retry_s=5.0)
        add_nodes(self.client, 1, 1)
        return self.client

    def stop(self) -> None:
        close_node_streams()
        if self.client is not None:
            self.client.close()
        if self.srv is not None:
            self.srv.stop()
        self.srv = self.client = None


def test_a_queued_first_permit_survives_a_reload(redis_server: RedisProcess) -> None:
    server = ReloadingServer(redis_server)
    try:
        client = server.start()
        a, b = client.register_job(job_spec("a")), client.register_job(job_spec("b"))
        held = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
        with pytest.raises(Exception, match="not granted"):
            b.acquire(Phase.ROLLOUT, 0, timeout_s=0.2)  # queued behind a
        server.stop()
        client = server.start()  # a restart: the state comes back from Redis
        assert client.job("b", b.token).status().permit_state == "queued"
        client.job("a", a.token).release(held, 1.0)
        granted = client.job("b", b.token).acquire(Phase.ROLLOUT, 0, timeout_s=10)
        assert granted.job == "b" and granted.epoch > held.epoch
    finally:
        server.stop()


@contextlib.contextmanager
def leader_and_standby(redis: RedisProcess, workdir: Path, flags: list[str]) -> Iterator[tuple[CoordinatorProcess,
                                                                                              CoordinatorProcess]]:
    """Coordinator processes "a" (started: the leader) and "b" (start it to stand by); both killed after."""
    a = CoordinatorProcess(redis.url, workdir, instance_id="a", extra=flags)
    b = CoordinatorProcess(redis.url, workdir, instance_id="b", extra=flags)
    a.start()
    try:
        yield a, b
    finally:
        close_node_streams()
        if a.proc is not None:
            a.proc.send_signal(signal.SIGCONT)
        a.kill()
        b.kill()


@pytest.mark.timeout(120)
def test_two_jobs_holding_each_others_turn_after_a_reload_both_go_on(redis_server: RedisProcess) -> None:
    import redis

    server = ReloadingServer(redis_server)
    try:
        client = server.start()
        x, y = client.register_job(job_spec("x")), client.register_job(job_spec("y"))
        assert x.status().rollout_nodes == y.status().rollout_nodes == ("r0",)
        for job in (x, y, x, x):  # x: Rollout(0); y: Rollout(0); x: Train(0), Sync(0)
            info = job.status()
            job.release(job.acquire(info.next_phase, info.next_iteration, timeout_s=5), 1.0)
        server.stop()
        # What a crash that lost some of the last writes can leave: both next phases waiting, x's
        # Rollout(1) behind y's turn on r0, y's Train(0) behind x's turn on t0.
        db = redis.Redis.from_url(redis_server.url)
        for name in ("x", "y"):
            permit = json.loads(db.hget("rollmux:state", f"permit/{name}"))
            db.hset("rollmux:state", f"permit/{name}", json.dumps({**permit, "state": "queued", "nodes": []}))
        db.hset("rollmux:state", mapping={"served/r0": json.dumps("x"), "served/t0": json.dumps("y")})
        client = server.start()
        x, y = client.job("x", x.token), client.job("y", y.token)
        assert (x.status().next_phase, y.status().next_phase) == (Phase.ROLLOUT, Phase.TRAIN)
        # The cycle breaks at r0 (y waits elsewhere): x rolls out, then takes its Train turn on t0;
        # y trains after it. Each phase is granted within the wait: nobody waits on a stuck turn.
        for job in (x, x, x, y, y):
            info = job.status()
            job.release(job.acquire(info.next_phase, info.next_iteration, timeout_s=5), 1.0)
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_long_wait_that_loses_its_leader_gets_its_retries(redis_server: RedisProcess, tmp_path: Path) -> None:
    with leader_and_standby(redis_server, tmp_path, ["--lease-ttl", "30", "--leader-ttl", "1"]) as (leader, standby):
        op = CoordinatorClient([leader.address, standby.address], retry_s=30.0)
        add_nodes(op, 1, 1)
        standby.start()
        a, b = op.register_job(job_spec("a")), op.register_job(job_spec("b"))
        held = a.acquire(Phase.ROLLOUT, 0, timeout_s=10)  # b's rollout waits behind a's
        retry_s = 5.0
        waiter = CoordinatorClient([leader.address, standby.address], retry_s=retry_s)
        got: list[object] = []

        def wait_b() -> None:
            try:
                got.append(waiter.job("b", b.token).acquire(Phase.ROLLOUT, 0, timeout_s=60))
            except Exception as exc:  # recorded, asserted below
                got.append(exc)

        t = threading.Thread(target=wait_b)
        t.start()
        time.sleep(retry_s + 1.0)  # the wait is older than the retry window
        leader.kill()  # the standby takes over within about a leader TTL
        a.release(held, 1.0)
        t.join(60)
        assert got and not isinstance(got[0], Exception), got
        assert got[0].job == "b" and got[0].phase is Phase.ROLLOUT  # type: ignore[attr-defined]
        waiter.close()
        op.close()


@pytest.mark.timeout(120)
def test_a_leader_that_stands_by_sends_its_sidecars_to_the_new_leader(redis_server: RedisProcess,
                                                                      tmp_path: Path) -> None:
    with leader_and_standby(redis_server, tmp_path, ["--leader-ttl", "1", "--heartbeat-interval", "0.2"]) as (a, b):
        client = CoordinatorClient([a.address, b.address], retry_s=30.0)
        add_nodes(client, 1, 1)  # their streams go to a, the leader
        b.start()
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)  # a misses its leadership renewals: b takes over
        at_b = CoordinatorClient(b.address, retry_s=30.0)
        deadline = time.monotonic() + 30
        while not at_b.cluster_state().ready:
            assert time.monotonic() < deadline, "the standby did not take over"
            time.sleep(0.1)
        a.proc.send_signal(signal.SIGCONT)  # a finds its lease gone and stands by
        deadline = time.monotonic() + 30
        while {n.node_id: n.state for n in at_b.cluster_state().nodes} != {"r0": "ready", "t0": "ready"}:
            assert time.monotonic() < deadline, (
                f"the nodes did not reach the new leader: {[(n.node_id, n.state) for n in at_b.cluster_state().nodes]}")
            time.sleep(0.1)
        job = at_b.register_job(job_spec("after"))
        assert job.acquire(Phase.ROLLOUT, 0, timeout_s=10).nodes == ("r0",)
        at_b.close()
        client.close()
