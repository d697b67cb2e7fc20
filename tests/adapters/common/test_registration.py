"""Opt-in check, fail-fast sidecar check, job naming and the job environment handed to Ray actors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rollmux.adapters.common import AdapterError
from rollmux.adapters.common import registration as reg
from rollmux.shim.registration import Registration
from tests.adapters.conftest import run_fresh


def test_adapter_machinery_imports_nothing_heavy() -> None:
    res = run_fresh('''
import sys
import rollmux.adapters.common, rollmux.adapters.common.registration
from rollmux.adapters.common import opted_in
assert not opted_in()
heavy = [m for m in ("grpc", "torch", "ray", "verl") if m in sys.modules]
assert not heavy, heavy
''')
    assert res.returncode == 0, res.stderr


def test_check_sidecar_names_the_socket(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.sock")
    with pytest.raises(AdapterError, match=f"no sidecar socket exists at that path.*{missing}"):
        reg.check_sidecar(missing)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens
    with pytest.raises(AdapterError, match="refused the connection"):
        reg.check_sidecar(str(stale))


def test_job_name_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLMUX_JOB", raising=False)
    a, b = reg.job_name("my proj", "exp/1"), reg.job_name("my proj", "exp/1")
    assert a.startswith("my_proj-exp_1-") and a != b
    monkeypatch.setenv("ROLLMUX_JOB", "given")
    assert reg.job_name("x") == "given"
    monkeypatch.setenv("ROLLMUX_SIDECAR_SOCKET", "/run/s.sock")
    ident = Registration(job="given", token="s3cret")
    envs = reg.job_env(ident)
    assert envs["ROLLMUX_JOB"] == "given"
    assert "ROLLMUX_SIDECAR_SOCKET" not in envs, "each node's processes name their own node's sidecar"
    assert "s3cret" not in repr(ident) and "s3cret" not in repr(envs), "Ray logs runtime environments"
    merged = reg.merge_runtime_env({"env_vars": {"A": "1"}, "pip": ["x"]}, {"B": "2"})
    assert merged == {"env_vars": {"A": "1", "B": "2"}, "pip": ["x"]}


def test_slo_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMUX_SLO", "0.5")
    with pytest.raises(AdapterError, match="ROLLMUX_SLO='0.5' is invalid"):
        reg.slo()
    monkeypatch.setenv("ROLLMUX_SLO", "2")
    assert reg.slo() == 2.0


@pytest.mark.parametrize("raw", ["40", "40,95,1", "a,b", "0,5", "5,-1", "nan,5", "inf,5", "5,86401"])
def test_phase_times_refuse_what_is_not_two_positive_durations(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("ROLLMUX_PHASE_S", raw)
    with pytest.raises(AdapterError, match=f"ROLLMUX_PHASE_S='{raw}' is invalid: expected ROLLOUT,TRAIN"):
        reg.phase_times()


def test_phase_times_are_read_and_reach_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollmux.adapters.verl.spec import job_spec

    monkeypatch.delenv("ROLLMUX_PHASE_S", raising=False)
    assert reg.phase_times() == (None, None)
    monkeypatch.setenv("ROLLMUX_PHASE_S", " 40, 95.5 ")
    assert reg.phase_times() == (40.0, 95.5)
    cfg = {"actor_rollout_ref": {"model": {"path": "unused"}}}
    spec = job_spec(cfg, name="j", slo=2.0, params=10**9, phase_s=reg.phase_times())
    assert (spec.t_roll_s, spec.t_train_s) == (40.0, 95.5)
    assert job_spec(cfg, name="j", slo=2.0, params=10**9).t_roll_s is None  # left to the coordinator's estimate


STANDALONE = {"nnodes": 1, "n_gpus_per_node": 2}


@pytest.mark.parametrize(("rollout", "trainer_mode", "mode"), [
    ({}, "sync", "colocated-train"),
    (STANDALONE, "sync", "colocated-train"),  # veRL 0.9's sync trainer ignores rollout.nnodes: hybrid engine
    (STANDALONE, "separate_async", "disaggregated"),  # its only standalone-rollout trainer
])
def test_a_verl_job_registers_its_own_deployment_mode(rollout: dict, trainer_mode: str,  # type: ignore[type-arg]
                                                      mode: str) -> None:
    """veRL's hybrid engine rolls out on the training GPUs; only the v1 ``separate_async`` trainer
    builds a standalone rollout pool (disaggregated). veRL builds its pools from the config: a constraint."""
    from rollmux.adapters.verl.spec import job_spec

    cfg = {"actor_rollout_ref": {"model": {"path": "unused"}, "rollout": rollout},
           "trainer": {"nnodes": 1, "n_gpus_per_node": 2, "v1": {"trainer_mode": trainer_mode}}}
    spec = job_spec(cfg, name="j", slo=2.0, params=10**9)
    assert spec.deployment is not None and spec.deployment.value == mode
    assert (spec.n_train_gpus, spec.n_rollout_gpus) == (2, 2)


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A coordinator with a bootstrap secret and two sidecars started with --secret-file (as the chart)."""
    from rollmux.demo.launch import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("secured"), secret="bootstrap-secret-for-tests") as cluster:
        yield cluster


def _spec(name: str):  # type: ignore[no-untyped-def]
    from rollmux.core.model import JobSpec

    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=1.0, t_train_s=1.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=1 << 20)


def test_register_relays_through_the_sidecar_without_any_token(secured_cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from rollmux.shim import api as shim
    from rollmux.shim import registration as sidecar_registration

    monkeypatch.delenv("ROLLMUX_JOB_TOKEN", raising=False)
    monkeypatch.setenv("ROLLMUX_SIDECAR_SOCKET", secured_cluster.sockets["train"])
    ident = reg.register(_spec("adapter-relayed"))
    sidecar_registration._clear()
    assert ident.relayed and ident.job == "adapter-relayed" and len(ident.token) >= 32
    assert ident.token not in repr(ident)
    [job] = [j for j in secured_cluster.client.cluster_state().jobs if j.job == "adapter-relayed"]
    assert job.relayed_by == "train-0"
    rank = shim.attach_rank(socket=secured_cluster.sockets["rollout"], job=ident.job, job_token=ident.token, rank=1)
    try:  # the token the sidecar handed back authenticates the job's ranks; phases follow one another
        ctx = rank.enter("rollout", 0)
        assert ctx.owner and ctx.lease is not None and ctx.lease.nodes == ("rollout-0",)
        rank.exit(ctx)
        rank.exit(rank.enter("sync", 0))  # the train pool's phase: followed, not held, on a rollout node
    finally:
        rank.close(job_done=True)


def test_register_refused_names_the_reason_and_an_operator_token_is_used_as_is(secured_cluster,
                                                                               monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from rollmux.shim.registration import JobRegistrationError

    monkeypatch.delenv("ROLLMUX_JOB_TOKEN", raising=False)
    monkeypatch.setenv("ROLLMUX_SIDECAR_SOCKET", secured_cluster.sockets["train"])
    with pytest.raises(JobRegistrationError, match="not registered"):
        reg.register(_spec("bad name with spaces"))
    monkeypatch.setenv("ROLLMUX_JOB", "by-operator")
    monkeypatch.setenv("ROLLMUX_JOB_TOKEN", "operator-issued")
    ident = reg.register(_spec("ignored"))
    assert (ident.job, ident.token, ident.relayed) == ("by-operator", "operator-issued", False)
    assert "by-operator" not in {j.job for j in secured_cluster.client.cluster_state().jobs}


def test_job_token_prefers_the_operator_variable_else_names_the_missing_registration(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROLLMUX_JOB_TOKEN", "operator-issued")
    assert reg.job_token("j") == "operator-issued"
    monkeypatch.delenv("ROLLMUX_JOB_TOKEN")
    with pytest.raises(AdapterError, match="no job token for job 'j' in this Ray instance"):
        reg.job_token("j")  # no Ray instance here, nothing published
