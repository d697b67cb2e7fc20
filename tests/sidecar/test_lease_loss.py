"""A real shim whose permit is revoked stops its phase (fenced) and says so; the node goes on to the next job.

Against the real services: a coordinator on a real redis-server over real gRPC, a real node sidecar
on its Unix socket, and the shim in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rollmux.core.model import Phase, Pool
from rollmux.shim import env
from rollmux.wire.client import CoordinatorClient

from .conftest import REPO, register

SHIM = r"""
import sys, time, rollmux
from rollmux.wire.errors import LeaseLostError
rollmux.init()
try:
    with rollmux.phase("rollout", iteration=0) as ctx:
        print("running", ctx.lease.epoch, flush=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:  # the phase's work, in small steps
            time.sleep(0.02)
        print("the phase ran to its end", flush=True)
except LeaseLostError as exc:
    print("stopped:", exc, flush=True)
    rollmux.shutdown()
    sys.exit(7)
"""


@pytest.mark.parametrize("coordinator", ["redis"], indirect=True)  # its state in a real redis-server
def test_revoked_lease_stops_the_running_phase_and_the_node_goes_on(coordinator, make_node, tmp_path) -> None:
    node = make_node("r0", Pool.ROLLOUT)
    make_node("t0", Pool.TRAIN)
    token_a = register(coordinator, "job-a")
    token_b = register(coordinator, "job-b")
    client = CoordinatorClient(coordinator.address)
    assert {j.job: tuple(j.rollout_nodes) for j in client.cluster_state().jobs} == {"job-a": ("r0",),
                                                                                   "job-b": ("r0",)}
    log = tmp_path / "events.jsonl"
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(REPO), env.SIDECAR_SOCKET: node.socket, env.JOB: "job-a", env.JOB_TOKEN: token_a,
              env.EVENT_LOG: str(log)})
    proc = subprocess.Popen([sys.executable, "-c", SHIM], cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[0] == "running", first
        epoch = int(first[1])
        revoked_at = time.monotonic()
        client.remove_job("job-a")  # the operator ends job a: its lease is revoked mid-phase
        out, err = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - revoked_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 7, (out, err)
    assert "the phase ran to its end" not in out and f"epoch {epoch} was revoked" in out
    assert f"epoch {epoch} was revoked" in err and "stopping the phase" in err  # it says so on stderr
    assert stopped_s < 10, f"the phase kept running {stopped_s:.1f}s after its lease was revoked"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["phase"], r["epoch"], bool(r.get("lost"))) for r in records] == [("rollout", epoch, True)]
    b = client.job("job-b", token_b).acquire(Phase.ROLLOUT, 0, timeout_s=10)  # the node goes on to job b
    assert b.nodes == ("r0",) and b.epoch > epoch
    assert "revoked" in " ".join(node.agent.status()["events"])
    client.close()
