"""The chart's pods, run as local processes with their rendered flags: a coordinator on a
chart-configured Redis, a sidecar per pool, and a job process opted in the way NOTES.txt says (the
one socket variable, no token) that registers through its node's sidecar and runs a phase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollmux.shim import env as sidecar_env
from rollmux.wire.auth import operator_token
from rollmux.wire.client import CoordinatorClient

from .conftest import ROOT, ci_values, render
from .local_pods import CLEAN_ENV, chart_coordinator, chart_sidecar

JOB = """
import rollmux
from rollmux.core.model import JobSpec
reg = rollmux.register(JobSpec(name="chart-job", n_rollout_gpus=8, n_train_gpus=8, t_roll_s=1.0, t_train_s=1.0,
                               slo=3.0, rollout_state_bytes=1 << 20, train_state_bytes=1 << 20))
assert rollmux.init() is True
with rollmux.phase("rollout") as ctx:
    print("epoch", ctx.lease.epoch, flush=True)
    input()  # hold the permit until the test has looked
rollmux.shutdown(job_done=True)
print("done")
"""


@pytest.mark.timeout(180)
def test_a_job_opted_in_by_the_socket_variable_registers_through_the_chart_sidecar_and_runs(tmp_path: Path) -> None:
    r = render(ci_values("defaults"))
    with chart_coordinator(r, tmp_path) as coord, chart_sidecar(r, "rollout", "node-r0", coord, tmp_path) as sock, \
            chart_sidecar(r, "train", "node-t0", coord, tmp_path):
        job = subprocess.Popen([sys.executable, "-c", JOB], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**CLEAN_ENV, sidecar_env.SIDECAR_SOCKET: str(sock)})
        try:
            assert job.stdout is not None and job.stdin is not None
            line = job.stdout.readline()
            assert line.startswith("epoch "), job.communicate(timeout=30)[1]
            state = CoordinatorClient(coord.address, token=operator_token(coord.secret)).cluster_state()
            (record,) = [j for j in state.jobs if j.job == "chart-job"]
            assert record.relayed_by == "node-r0" and record.state == "admitted"
            assert {n.node_id for n in state.nodes} == {"node-r0", "node-t0"}
            job.stdin.write("\n")
            job.stdin.flush()
            out, err = job.communicate(timeout=60)
            assert job.returncode == 0 and out.strip() == "done", err
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        remaining = CoordinatorClient(coord.address, token=operator_token(coord.secret)).cluster_state().jobs
        assert "chart-job" not in {j.job for j in remaining}  # a clean exit deregisters
