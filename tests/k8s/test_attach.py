"""The coordinator side of the scheduler: a job registered on its behalf (`attachable`), which its driver
takes over through a sidecar of one of its placed nodes, once. Real gRPC coordinator on a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import JobSpec, Phase, Pool
from rollmux.testing.chaos.procs import RedisProcess
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import AlreadyExistsError, FailedPreconditionError, PermissionDeniedError
from tests.coordinator.service.conftest import add_node, close_node_streams

from .conftest import FAST


@pytest.fixture
def client(redis_server: RedisProcess) -> Iterator[CoordinatorClient]:
    srv = ThreadedServer(ServerOptions(redis_url=redis_server.url, config=FAST, http="127.0.0.1:0"))
    assert srv.wait_ready(10), srv.core.not_ready_reason
    c = CoordinatorClient(srv.address, retry_s=5.0)
    for name, pool in (("r0", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("r1", Pool.ROLLOUT)):
        add_node(c, name, pool)
    yield c
    close_node_streams()
    c.close()
    srv.stop()


def spec(name: str, gpus: int = 8) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=gpus, n_train_gpus=8, t_roll_s=10.0, t_train_s=10.0, slo=1.0)


def test_the_driver_attaches_once_through_a_placed_node(client: CoordinatorClient) -> None:
    scheduler_handle = client.register_job(spec("a"), attachable=True)
    nodes = {*scheduler_handle.registration.rollout_nodes, *scheduler_handle.registration.train_nodes}
    assert nodes == {"r0", "t0"}
    with pytest.raises(AlreadyExistsError, match="may not attach"):  # not one of its nodes
        client.register_job(spec("a"), relay_node="r1")
    with pytest.raises(FailedPreconditionError, match="n_rollout_gpus"):  # not the spec it was placed for
        client.register_job(spec("a", gpus=16), relay_node="t0")
    with pytest.raises(AlreadyExistsError):  # an operator registration never attaches
        client.register_job(spec("a"))

    driver = client.register_job(spec("a"), relay_node="t0")
    info = driver.status()
    assert (info.group_id, info.relayed_by) == (scheduler_handle.registration.group_id, "t0")
    with pytest.raises(PermissionDeniedError):  # the scheduler's token stopped working
        scheduler_handle.status()
    with pytest.raises(AlreadyExistsError):  # once only: a second driver is refused
        client.register_job(spec("a"), relay_node="r0")
    driver.release(driver.acquire(Phase.ROLLOUT, 0, timeout_s=10), 0.0)


def test_a_pending_job_cannot_be_attached_before_it_is_placed(client: CoordinatorClient) -> None:
    client.register_job(spec("a"), attachable=True)
    waiting = client.register_job(spec("b"), attachable=True)  # no free training node left
    assert waiting.registration.state == "pending"
    with pytest.raises(AlreadyExistsError, match="no nodes yet"):
        client.register_job(spec("b"), relay_node="r1")


def test_without_the_flag_a_relayed_registration_of_a_taken_name_is_refused(client: CoordinatorClient) -> None:
    client.register_job(spec("a"))
    with pytest.raises(AlreadyExistsError, match="operator token"):
        client.register_job(spec("a"), relay_node="t0")
