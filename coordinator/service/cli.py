"""`rollmux coordinator`: run the coordinator service (gRPC + health + HTTP probes)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys

from rollmux.coordinator.service.event_loop import EventLoop, EventLoopUnavailable, resolve
from rollmux.coordinator.service.event_loop import run as run_event_loop

HELP = "Run the coordinator service (gRPC API rollmux.v1, Redis or embedded state, probes, metrics)."

LIVE_MECHANISMS = ("learn", "regroup", "work_aware", "best_move", "regroup_on_learn")
"""The policy mechanisms a live coordinator may switch off (`PolicyConfig` fields; deployment modes are
opt-in, ``--deployment-modes``; the rest run as `PolicyConfig.live` sets them)."""


def configure(parser: argparse.ArgumentParser) -> None:
    from rollmux.coordinator.policy.flags import add_mechanism_flags
    from rollmux.coordinator.service import env
    from rollmux.wire import env as wire_env

    parser.add_argument("--listen", default="0.0.0.0:50051", help="gRPC HOST:PORT (port 0 = any free port)")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--redis", default=os.environ.get(env.REDIS_URL), help="Redis URL (redis://host:port/db)")
    store.add_argument("--embedded", action="store_true", help="keep state in this process (single machine)")
    parser.add_argument("--namespace", default="rollmux", help="Redis key prefix")
    parser.add_argument("--http", default="0.0.0.0:8080", help="HOST:PORT for /livez /readyz /metrics ('' = off)")
    parser.add_argument("--secret-file", help=f"file holding the bootstrap secret (else ${wire_env.SECRET_FILE} names "
                                              f"the file, else ${wire_env.BOOTSTRAP_SECRET} holds it)")
    parser.add_argument("--instance-id", default=socket.gethostname(),
                        help="leadership owner name; a restart with the same id takes over at once, "
                             "a standby with another id waits for the lease to lapse")
    parser.add_argument("--leader-ttl", type=float, default=5.0, help="leadership lease TTL, s")
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="run permit lease TTL, s")
    parser.add_argument("--max-wait", type=float, default=300.0, help="longest server-side permit wait, s")
    parser.add_argument("--migration-threshold", type=float, default=0.8,
                        help="rollout progress at which it is tail-bound (long-tail migration)")
    from rollmux.coordinator.policy.registry import ONLINE_POLICIES

    parser.add_argument("--heartbeat-interval", type=float, default=2.0,
                        help="how often sidecars send heartbeats, s (a node silent 3 intervals turns LOST)")
    parser.add_argument("--policy", choices=ONLINE_POLICIES, default="rollmux",
                        help="placement policy by name, as in `rollmux place` and `rollmux simulate` [default: rollmux]")
    parser.add_argument("--max-group-size", type=int, default=5, help="most jobs per co-execution group")
    parser.add_argument("--catalog", help="YAML GPU catalog overrides ({gpus: {NAME: {tflops, hbm_gb, hbm_tb_s, "
                                          "usd_per_gpu_h}}}); nodes must report a GPU type it lists")
    parser.add_argument("--rollout-gpu", default="H20", help="GPU type of new rollout nodes the policy plans with")
    parser.add_argument("--train-gpu", default="H800", help="GPU type of new training nodes the policy plans with")
    parser.add_argument("--event-loop", choices=[e.value for e in EventLoop], default=EventLoop.AUTO.value,
                        help="the event loop the service runs on: auto = uvloop where installed (a dependency "
                             "of rollmux except on Windows), asyncio otherwise. uvloop schedules the service's "
                             "calls with fewer slow ones than asyncio at the same CPU (docs/design/decisions.md) "
                             "[default: auto]")
    parser.add_argument("--deployment-modes", action="store_true",
                        help="choose each job's deployment mode (co-located where cheaper; docs/design/policy.md); "
                             "default: every job disaggregated")
    add_mechanism_flags(parser, only=LIVE_MECHANISMS)
    parser.add_argument("--relocation-deadline", type=float, default=120.0,
                        help="seconds a job has to honour a relocation directive before it expires (it then "
                             "keeps its place)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--max-nodes-per-job", type=int, default=1024,
                        help="most nodes one job may ask for in either pool (bigger specs are refused)")
    parser.add_argument("--no-relayed-registration", action="store_true",
                        help="refuse job registrations relayed by node sidecars (then only the operator token "
                             "registers jobs)")
    parser.add_argument("--tls-cert", help="PEM certificate (with --tls-key: serve TLS)")
    parser.add_argument("--tls-key", help="PEM private key")
    parser.add_argument("--port-file", help="write the bound gRPC and HTTP ports here (JSON) once listening")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")


def run(args: argparse.Namespace) -> int:
    import json

    from rollmux.coordinator.policy.api import PolicyConfig
    from rollmux.coordinator.policy.flags import mechanisms_on
    from rollmux.coordinator.service import logs
    from rollmux.coordinator.service.runtime.api import ServiceConfig
    from rollmux.coordinator.service.server import Running, ServerOptions, serve
    from rollmux.core.errors import SpecError
    from rollmux.core.model import ClusterSpec, GpuCatalog
    from rollmux.wire.auth import read_secret

    logs.setup(args.log_level, args.log_format)
    if not args.redis and not args.embedded:
        print("rollmux coordinator: give --redis URL (or $ROLLMUX_REDIS_URL) or --embedded", file=sys.stderr)
        return 2
    try:
        event_loop = resolve(args.event_loop)
    except EventLoopUnavailable as exc:
        print(f"rollmux coordinator: --{exc}", file=sys.stderr)
        return 2
    try:
        secret = read_secret(args.secret_file)
    except ValueError as exc:
        print(f"rollmux coordinator: {exc}", file=sys.stderr)
        return 2
    try:
        opts = ServerOptions(
            listen=args.listen, http=args.http or None, redis_url=None if args.embedded else args.redis,
            namespace=args.namespace, secret=secret, owner=args.instance_id, leader_ttl_s=args.leader_ttl,
            tls_cert=args.tls_cert, tls_key=args.tls_key,
            config=ServiceConfig(lease_ttl_s=args.lease_ttl, max_wait_s=args.max_wait,
                                 migration_threshold=args.migration_threshold,
                                 heartbeat_interval_s=args.heartbeat_interval,
                                 max_nodes_per_job=args.max_nodes_per_job,
                                 relayed_registration=not args.no_relayed_registration,
                                 policy=PolicyConfig.live(modes=args.deployment_modes, **mechanisms_on(args)),
                                 relocation_deadline_s=args.relocation_deadline),
            cluster=ClusterSpec(rollout_gpu=args.rollout_gpu, train_gpu=args.train_gpu,
                                gpus_per_node=args.gpus_per_node,
                                catalog=GpuCatalog.from_yaml(args.catalog) if args.catalog else GpuCatalog.default()),
            policy=args.policy, max_group_size=args.max_group_size, event_loop=event_loop.value)
    except (SpecError, ValueError) as exc:
        print(f"rollmux coordinator: {exc}", file=sys.stderr)
        return 2

    def started(running: Running) -> None:
        if args.port_file:
            tmp = args.port_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"grpc": running.port, "http": running.http_port, "pid": os.getpid()}, f)
            os.replace(tmp, args.port_file)

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        await serve(opts, started)

    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        run_event_loop(main(), event_loop)
    return 0
