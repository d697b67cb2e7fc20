"""Hardening at the coordinator, against the real gRPC server (embedded store and Redis):
absurd numbers refused with INVALID_ARGUMENT and nothing stored, unexpected exceptions answered
INTERNAL with a logged request id, and job calls authenticated before the job is looked up."""

from __future__ import annotations

import logging
import math

import grpc
import pytest

from rollmux.coordinator.service import server as server_module
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Phase
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
from rollmux.wire.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError

from .conftest import FAST, add_nodes, job_spec


def stored(srv: ThreadedServer) -> dict[str, str]:
    return srv.call(srv.core.store.load())


def spec_pb(**fields: float) -> pb.JobSpec:
    return pb.JobSpec(name="huge", n_rollout_gpus=8, n_train_gpus=8, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields,needle", [
    ({"model_params_b": 1e308}, "model_params_b"),  # raised OverflowError in the profiler -> UNKNOWN
    ({"slo": 1e308}, "slo"),
    ({"slo": math.nan}, "slo"),
    ({"t_roll_s": 1e308}, "t_roll_s"),
    ({"t_train_s": 1e308}, "t_train_s"),
    ({"t_train_s": math.inf}, "t_train_s"),
    ({"max_tokens": 2**31 - 1}, "max_tokens"),
    ({"turns": 2**31 - 1}, "turns"),
    ({"rollout_state_bytes": 2**62}, "rollout_state_bytes"),
])
def test_absurd_spec_numbers_are_invalid_argument_and_store_nothing(client, coordinator, fields, needle) -> None:
    add_nodes(client, 1, 1)
    before = stored(coordinator)
    with pytest.raises(InvalidArgumentError, match=needle):
        client.call("RegisterJob", pb.RegisterJobRequest(spec=spec_pb(**fields)))
    assert stored(coordinator) == before


def test_absurd_durations_and_waits_are_refused_and_change_nothing(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    a = client.register_job(job_spec("a"))
    p = a.acquire(Phase.ROLLOUT, 0, timeout_s=5)
    before = stored(coordinator)
    for duration in (1e300, math.inf, 3600.0):  # 3600 s after holding the lease for < 1 s + 300 s wait limit
        with pytest.raises(InvalidArgumentError, match="duration_s"):
            a._call("ReleasePermit", pb.ReleasePermitRequest(job="a", epoch=p.epoch, duration_s=duration))
        with pytest.raises(InvalidArgumentError, match="duration_s"):
            a._call("AdvancePermit", pb.AdvancePermitRequest(job="a", epoch=p.epoch, duration_s=duration,
                                                              timeout_s=1))
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        a._call("AcquirePermit", pb.AcquirePermitRequest(job="a", phase=pb.PHASE_ROLLOUT, iteration=0,
                                                          timeout_s=1e12))
    assert stored(coordinator) == before
    assert a.status().next_phase is Phase.ROLLOUT
    a.release(p, 0.05)  # a sane duration is taken
    jobs = {j.job: j for j in client.cluster_state().jobs}
    assert 0 < jobs["a"].observed_roll_s < 1.0


@pytest.mark.parametrize("fields,needle", [({"gpu_count": 10**6}, "gpu_count"),
                                           ({"host_dram_bytes": 2**62}, "host_dram_bytes"),
                                           ({"nvml": {"": "x"}}, "nvml")])
def test_absurd_node_facts_are_refused(client, coordinator, fields, needle) -> None:
    before = stored(coordinator)
    req = {"node_id": "n", "pool": pb.POOL_ROLLOUT, "gpu_type": "H20", "gpu_count": 8, "host_dram_bytes": 10**12}
    req.update(fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=needle):
        client.call("RegisterNode", pb.RegisterNodeRequest(**req))  # type: ignore[arg-type]
    assert stored(coordinator) == before


def test_get_job_authenticates_before_lookup(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    real = client.register_job(job_spec("real"))
    for name in ("real", "ghost"):  # an existing and an unknown job answer alike
        with pytest.raises(UnauthenticatedError):
            client.job(name, "").status()
    answers = []
    for name in ("real", "ghost"):
        with pytest.raises(PermissionDeniedError) as info:
            client.job(name, "wrong-token").status()
        answers.append(str(info.value).replace(repr(name), "<job>"))
    assert answers[0] == answers[1], answers  # nothing tells the two apart
    assert real.status().job == "real"


def test_unexpected_exception_is_internal_with_a_logged_request_id(monkeypatch, caplog) -> None:
    def broken(spec, cluster):  # type: ignore[no-untyped-def]
        raise RuntimeError("profiler bug")

    monkeypatch.setattr(server_module, "resolved_spec", broken)
    srv = ThreadedServer(ServerOptions(config=FAST, http=None))
    try:
        assert srv.wait_ready(10)
        caplog.set_level(logging.ERROR, logger="rollmux.coordinator")
        channel = grpc.insecure_channel(srv.address)
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterJob(pb.RegisterJobRequest(spec=spec_pb()), metadata=[("x-request-id", "req-42")], timeout=10)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "req-42" in (info.value.details() or "")
        logged = [r for r in caplog.records if "req-42" in r.getMessage()]
        assert logged and logged[0].exc_info and "profiler bug" in str(logged[0].exc_info[1])
        assert not srv.call(srv.core.store.load()).get("job/huge")
        channel.close()
    finally:
        srv.stop()

