"""A co-located job's rank on its training node owns every phase, Rollout included: it asks the
coordinator for the permit there, through the real sidecar, and the grant holds that node."""

from __future__ import annotations

from pathlib import Path

from rollmux.core.model import JobSpec, Pool
from rollmux.shim import env
from rollmux.wire.client import CoordinatorClient

from .conftest import run_python

ITERATION = r"""
import sys
import rollmux
rollmux.init()
for phase in sys.argv[1].split(","):
    with rollmux.phase(phase) as ctx:
        print(phase, ",".join(ctx.lease.nodes) if ctx.lease else "follower")
rollmux.shutdown(job_done=True)
"""


def register(coordinator, name: str, deployment: str | None) -> str:  # type: ignore[no-untyped-def]
    spec = JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20, deployment=deployment)
    return str(CoordinatorClient(coordinator.address).register_job(spec).token)


def run_phases(socket: str, job: str, token: str, deployment: str | None, phases: str) -> dict[str, str]:
    variables = {env.SIDECAR_SOCKET: socket, env.JOB: job, env.JOB_TOKEN: token}
    if deployment:
        variables[env.DEPLOYMENT] = deployment
    res = run_python(ITERATION, variables, args=[phases])
    assert res.returncode == 0, res.stderr
    return dict(line.split(" ", 1) for line in res.stdout.strip().splitlines())


def test_a_colocated_job_runs_its_rollout_on_the_training_node(coordinator, make_node) -> None:  # type: ignore[no-untyped-def]
    make_node("r0", Pool.ROLLOUT)
    t0 = make_node("t0", Pool.TRAIN)
    token = register(coordinator, "colo", "colocated-train")
    assert run_phases(t0.socket, "colo", token, "colocated-train", "rollout,train,sync") == \
        {"rollout": "t0", "train": "t0", "sync": "t0"}


def test_a_disaggregated_job_rank_on_the_training_node_follows_the_rollout(coordinator, make_node) -> None:  # type: ignore[no-untyped-def]
    make_node("r0", Pool.ROLLOUT)
    t0 = make_node("t0", Pool.TRAIN)
    token = register(coordinator, "dis", "disaggregated")
    assert run_phases(t0.socket, "dis", token, None, "rollout") == {"rollout": "follower"}  # r0's rank asks for it


def test_an_unknown_deployment_mode_is_refused_naming_the_variable(tmp_path: Path) -> None:
    code = ("import rollmux\nfrom rollmux.wire.errors import ShimConfigError\n"
            "try:\n    rollmux.init()\nexcept ShimConfigError as e:\n    print(e)\nelse:\n    raise SystemExit(3)\n")
    sock = tmp_path / "s.sock"
    sock.touch()
    res = run_python(code, {env.SIDECAR_SOCKET: str(sock), env.JOB: "j", env.JOB_TOKEN: "t",
                            env.DEPLOYMENT: "hybrid"})
    assert res.returncode == 0, res.stderr
    assert "'hybrid'" in res.stdout and env.DEPLOYMENT in res.stdout
