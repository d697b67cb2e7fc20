"""A burst of calls, as after a failover when every job and sidecar comes back at once, is served
whole; and a call the server does shed (CANCELLED) is retried by the client."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer, start_in_thread
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
from rollmux.wire.client import CoordinatorClient

BURST = 3000  # above gRPC's default pending-call limit (1,000) and its hard limit (3,000)


@pytest.fixture
def served() -> Iterator[ThreadedServer]:
    srv = start_in_thread(ServerOptions(http=None))
    try:
        assert srv.wait_ready(10)
        yield srv
    finally:
        srv.stop()


def test_a_burst_of_simultaneous_calls_is_served_whole(served: ThreadedServer) -> None:
    async def burst() -> collections.Counter[str]:
        async with grpc.aio.insecure_channel(served.address) as ch:
            await ch.channel_ready()
            stub = health_pb2_grpc.HealthStub(ch)
            res = await asyncio.gather(*(stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
                                         for _ in range(BURST)), return_exceptions=True)
        return collections.Counter(r.code().name if isinstance(r, grpc.aio.AioRpcError) else type(r).__name__
                                   for r in res)

    assert asyncio.run(burst()) == {"HealthCheckResponse": BURST}


class _ShedsFirst(pb_grpc.CoordinatorServicer):
    """A real gRPC server answering GetClusterState, CANCELLED the first `shed` times."""

    def __init__(self, shed: int) -> None:
        self.shed, self.calls = shed, 0
        self.lock = threading.Lock()

    def GetClusterState(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        with self.lock:
            self.calls += 1
            shed = self.calls <= self.shed
        if shed:
            context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        return pb.ClusterStateResponse(ready=True, leader_fence=7)


def test_client_retries_a_call_the_server_shed() -> None:
    from concurrent.futures import ThreadPoolExecutor

    servicer = _ShedsFirst(shed=2)
    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = CoordinatorClient(f"127.0.0.1:{port}", retry_s=10)
    try:
        assert client.cluster_state().leader_fence == 7
        assert servicer.calls == 3
    finally:
        client.close()
        server.stop(0)
