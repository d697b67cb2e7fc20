"""Assemble and run a coordinator: store, core, gRPC server (+ grpc.health.v1), HTTP probes.

`serve()` runs until cancelled (the `rollmux coordinator` command); `start_in_thread()` runs one
in a background thread with its own event loop (tests, the embedded demo).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from rollmux.coordinator.policy.registry import create_policy
from rollmux.coordinator.service import gc_tuning
from rollmux.coordinator.service.auth import Authenticator
from rollmux.coordinator.service.core import Coordinator
from rollmux.coordinator.service.event_loop import new_event_loop
from rollmux.coordinator.service.http import ProbeServer
from rollmux.coordinator.service.runtime import resolved_spec
from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.runtime.state import live_policy_config
from rollmux.coordinator.service.servicer import CoordinatorServicer
from rollmux.coordinator.service.store import EmbeddedStore, Store
from rollmux.core.model import ClusterSpec
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc

log = logging.getLogger("rollmux.coordinator")

SERVICE_NAME = "rollmux.v1.Coordinator"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Transport limit on received messages; above `ServiceConfig.max_request_bytes` (validated by the servicer)."""
MAX_SEND_BYTES = 256 * 1024 * 1024
"""Answers may be large: the cluster state of a few hundred jobs is several MiB."""
MAX_PENDING_CALLS = 100_000
"""Calls that may wait for a handler before gRPC's server sheds new ones as CANCELLED.

gRPC's default (`grpc.server.max_pending_requests` 1,000, shedding at random above it up to a hard
limit of 3,000) drops part of the burst a cluster makes after a failover, when every job and every
sidecar (thousands of calls) reconnects at once; those calls are cheap to hold (a few kB each).
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    listen: str = "127.0.0.1:0"  # gRPC HOST:PORT (port 0 = any free port)
    http: str | None = "127.0.0.1:0"  # probes HOST:PORT, None = off
    redis_url: str | None = None  # None = embedded store
    namespace: str = "rollmux"  # Redis key prefix
    secret: str | None = None  # bootstrap secret for node and operator tokens
    owner: str = "coordinator"  # leadership lease owner name
    leader_ttl_s: float = 5.0
    tls_cert: str | None = None  # PEM files; both set = TLS on the gRPC port
    tls_key: str | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    config: ServiceConfig = field(default_factory=ServiceConfig)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    policy: str = "rollmux"  # placement policy by name (policy.api.ONLINE_POLICIES)
    max_group_size: int = 5  # most jobs per co-execution group
    event_loop: str = "auto"  # event_loop.EventLoop by value: uvloop where installed, asyncio otherwise


@dataclass(slots=True)
class Running:
    """A started coordinator: its ports and parts."""

    core: Coordinator
    server: grpc.aio.Server
    port: int
    http: ProbeServer | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http else None


def make_store(opts: ServerOptions) -> Store:
    if opts.redis_url:
        from rollmux.coordinator.service.redis_store import RedisStore

        return RedisStore(opts.redis_url, namespace=opts.namespace)
    return EmbeddedStore()


async def start(opts: ServerOptions, store: Store | None = None) -> Running:
    """Start everything; returns once the ports are bound (readiness follows asynchronously)."""
    if opts.max_message_bytes <= opts.config.max_request_bytes:
        raise ValueError(f"max_message_bytes={opts.max_message_bytes} must exceed config.max_request_bytes="
                         f"{opts.config.max_request_bytes}, or oversized requests get RESOURCE_EXHAUSTED "
                         "instead of INVALID_ARGUMENT")
    store = store or make_store(opts)
    policy = create_policy(opts.policy, config=live_policy_config(opts.config, max_group_size=opts.max_group_size))
    core = Coordinator(store, cluster=opts.cluster, config=opts.config, owner=opts.owner,
                       leader_ttl_s=opts.leader_ttl_s, policy=policy)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", opts.max_message_bytes),
                                      ("grpc.max_send_message_length", MAX_SEND_BYTES),
                                      ("grpc.so_reuseport", 0),
                                      ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                                      ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS)])
    servicer = CoordinatorServicer(core, Authenticator(opts.secret), lambda s: resolved_spec(s, opts.cluster))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    loop = asyncio.get_running_loop()

    def on_ready(ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            loop.create_task(health.set(name, status))

    core.on_ready_change = on_ready
    on_ready(False)
    if opts.tls_cert and opts.tls_key:
        with open(opts.tls_key, "rb") as k, open(opts.tls_cert, "rb") as c:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        port = server.add_secure_port(opts.listen, creds)
    else:
        port = server.add_insecure_port(opts.listen)
    await server.start()
    probes = None
    if opts.http:
        host, _, hport = opts.http.rpartition(":")
        probes = ProbeServer(host or "0.0.0.0", int(hport),
                             lambda: (core.ready, core.not_ready_reason), core.metrics.registry)
        probes.start()
    await core.start()
    log.info("coordinator listening", extra={"grpc_port": port, "http_port": probes.port if probes else None,
                                             "store": "redis" if opts.redis_url else "embedded",
                                             "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0]})
    return Running(core=core, server=server, port=port, http=probes)


async def stop(running: Running) -> None:
    await running.server.stop(grace=0.5)
    await running.core.stop()
    if running.http:
        running.http.stop()
    await running.core.store.close()


async def serve(opts: ServerOptions, on_started: Callable[[Running], None] | None = None) -> None:
    """Run until cancelled, as this process's one job: with the coordinator's garbage-collector
    pacing (`gc_tuning.PacedCollector`), with a full pass each time the state is (re)loaded."""
    running = await start(opts)
    gc_pause = running.core.metrics.gc_pause
    collector = gc_tuning.PacedCollector(on_pause=lambda kind, s: gc_pause.labels(**{"pass": kind}).observe(s),
                                         on_lag=running.core.metrics.loop_lag.observe)
    collector.start()
    sys.setswitchinterval(gc_tuning.GIL_SWITCH_INTERVAL_S)
    set_health = running.core.on_ready_change

    def on_ready(ready: bool) -> None:
        set_health(ready)
        if ready:
            log.info("heap settled after loading the state: %d objects frozen", collector.reclaim())

    running.core.on_ready_change = on_ready
    if running.core.ready:
        on_ready(True)
    if on_started:
        on_started(running)
    try:
        await running.server.wait_for_termination()
    finally:
        await stop(running)
        await collector.stop()


class ThreadedServer:
    """A coordinator on its own event loop in a daemon thread (tests, single-machine use)."""

    def __init__(self, opts: ServerOptions, store: Store | None = None) -> None:
        self._loop = new_event_loop(opts.event_loop)
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollmux-coordinator", daemon=True)
        self._thread.start()
        self.running: Running = self.call(start(opts, store))

    def call(self, coro, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def run(self, fn: Callable[[], object]) -> object:
        """Run a plain function on the server's loop thread (to read or poke state safely)."""

        async def _wrap() -> object:
            return fn()

        return self.call(_wrap())

    @property
    def address(self) -> str:
        return self.running.address

    @property
    def core(self) -> Coordinator:
        return self.running.core

    def wait_ready(self, timeout_s: float = 10.0) -> bool:
        return bool(self.call(self.core.wait_ready(timeout_s), timeout_s + 1))

    def stop(self) -> None:
        try:
            self.call(stop(self.running))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


def start_in_thread(opts: ServerOptions, store: Store | None = None) -> ThreadedServer:
    return ThreadedServer(opts, store)
