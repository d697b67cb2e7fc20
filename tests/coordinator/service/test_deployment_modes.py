"""The live runtime places and grants co-located jobs: a co-located Rollout runs on training nodes, in
its job's round-robin turn there, followed by its own Train and Sync in the same turn."""

from __future__ import annotations

from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import PermitState
from rollmux.coordinator.service.runtime.records import GroupRecord, JobRecord
from rollmux.core.model import Phase

from .builders import make_runtime, register
from .test_runtime import grant


def test_a_train_heavy_job_runs_every_phase_on_training_nodes() -> None:
    rt, _ = make_runtime(n_rollout=0, n_train=1, modes=True)
    job = register(rt, "a", t_roll_s=20, t_train_s=200, slo=1.3)
    assert job.deployment == "colocated-train" and job.rollout_nodes == ()
    (train_node,) = rt.state.placement.groups[job.group_id].train_nodes
    for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):
        p = grant(rt, "a")
        assert p.phase is phase and p.nodes == (train_node,)
        rt.release("a", p.epoch, 1.0)
    assert grant(rt, "a").iteration == 1
    rt.check_invariants()


def test_a_co_located_job_time_shares_the_training_pool_in_turn_with_a_disaggregated_one() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1, modes=True)
    from dataclasses import replace

    from .builders import spec

    heavy = replace(spec("r", t_roll_s=400, t_train_s=40, slo=1.5), deployment="disaggregated")
    rt.register_job(heavy, token_sha256="tr", nonce_sha256="nr")
    small = register(rt, "s", nr=16, t_roll_s=100, t_train_s=150, slo=2.0)  # two rollout nodes: none free
    assert small.deployment == "colocated-train" and small.group_id == rt.state.jobs["r"].group_id
    (t0,) = rt.state.placement.groups[small.group_id].train_nodes
    pr = grant(rt, "r")  # r's Rollout on its rollout node
    assert pr.nodes != (t0,)
    assert "turn" in views.wait_reason(rt, "s")  # s's Rollout queues on t0 behind r's Train (member order r, s)
    rt.release("r", pr.epoch, 1.0)
    for phase in (Phase.TRAIN, Phase.SYNC):
        p = grant(rt, "r")
        assert p.phase is phase and p.nodes == (t0,)
        rt.release("r", p.epoch, 1.0)
    pr1 = grant(rt, "r")  # r's next Rollout runs on its own node while s uses the training node
    for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):  # s: one turn on t0 for all three phases
        p = grant(rt, "s")
        assert p.phase is phase and p.nodes == (t0,)
        if phase is Phase.ROLLOUT:
            rt.release("r", pr1.epoch, 1.0)
            assert rt.state.permits["r"].state is PermitState.QUEUED  # r's Train(1) waits: the turn is s's
        rt.release("s", p.epoch, 1.0)
    assert grant(rt, "r").phase is Phase.TRAIN
    rt.check_invariants()


def test_the_deployment_mode_survives_a_restart_in_the_records() -> None:
    rt, _ = make_runtime(n_rollout=0, n_train=1, modes=True)
    job = register(rt, "a", t_roll_s=20, t_train_s=200, slo=1.3)
    back = JobRecord.from_json(job.to_json())
    assert back.deployment == "colocated-train"
    group = GroupRecord.from_json(GroupRecord(group_id="g0", train_nodes=("t0",), rollout_nodes=(), members=("a",),
                                              train_pool="rollout").to_json())
    assert group.train_pool == "rollout"
    assert isinstance(rt, Runtime)


def test_without_the_flag_every_job_is_disaggregated() -> None:
    rt, _ = make_runtime(n_rollout=1, n_train=1)
    assert register(rt, "a", t_roll_s=20, t_train_s=200, slo=1.3).deployment == "disaggregated"


def test_the_job_view_and_the_wire_carry_the_chosen_mode() -> None:
    """`rollmux status` and GetJob show the mode a job's phases are laid out by; "" before it is decided."""
    from rollmux.wire.convert import job_info_from_pb, job_info_to_pb

    rt, _ = make_runtime(n_rollout=0, n_train=1, modes=True)
    register(rt, "a", t_roll_s=20, t_train_s=200, slo=1.3)
    info = views.job_status(rt, "a")
    assert info.deployment == "colocated-train"
    assert job_info_from_pb(job_info_to_pb(info)).deployment == "colocated-train"
    waiting = register(rt, "b", nt=64, t_roll_s=20, t_train_s=200, slo=1.3)  # no node can take it yet
    assert waiting.state.value == "pending" and views.job_status(rt, "b").deployment == ""


def test_rollmux_status_prints_each_jobs_mode(client, coordinator, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`rollmux status` against a real coordinator: the jobs table and --json name a fixed mode."""
    import argparse
    import json
    from dataclasses import replace

    from rollmux.coordinator.service import status_cli

    from .conftest import job_spec

    client.register_job(replace(job_spec("hybrid"), deployment="colocated-train"))
    monkeypatch.setenv("COLUMNS", "250")
    args = argparse.Namespace(coordinator=coordinator.address, token=None, json=False, tls_ca=None, timeout=5.0)
    assert status_cli.run(args) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "hybrid" in line and "│" in line]  # the jobs table
    assert "colocated-train" in row
    assert status_cli.run(argparse.Namespace(**{**vars(args), "json": True})) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["deployment"] == "colocated-train"
