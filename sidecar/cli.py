"""`rollmux sidecar`: the node agent (one per node; a DaemonSet on Kubernetes)."""

from __future__ import annotations

import argparse
import os
import signal
import socket as _socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HELP = "Run a node's sidecar: register the node, hold its coordinator stream, serve local ranks on a socket."

DEFAULT_SOCKET_DIR = "/run/rollmux"
SOCKET_NAME = "sidecar.sock"
MAX_SOCKET_PATH = 107  # sun_path limit on Linux, minus the terminating NUL


def configure(parser: argparse.ArgumentParser) -> None:
    from rollmux.wire import env as coord_env

    parser.add_argument("--coordinator", default=os.environ.get(coord_env.COORDINATOR),
                        help=f"coordinator HOST:PORT[,HOST:PORT] (default ${coord_env.COORDINATOR})")
    parser.add_argument("--node-id", default=_socket.gethostname(), help="this node's id at the coordinator")
    parser.add_argument("--pool", choices=["rollout", "train"], required=True, help="the node's pool")
    parser.add_argument("--socket", default=None,
                        help=f"Unix socket for local ranks (default {DEFAULT_SOCKET_DIR}/{SOCKET_NAME}, or a temp "
                             "dir when that is not writable)")
    parser.add_argument("--gpu-type", default=None,
                        help="GPU catalog key to register (default: the catalog key of NVML's device name; "
                             "without NVML the pool's default, H20 for rollout, H800 for train)")
    parser.add_argument("--gpu-count", type=int, default=1, help="GPU count to register when NVML is unavailable")
    parser.add_argument("--no-nvml", action="store_true", help="do not use NVML even if present")
    from rollmux.sidecar import env
    from rollmux.sidecar.gpu import DEFAULT_PROCESS_LIMIT_BYTES

    parser.add_argument("--gpu-memory-standin", default=os.environ.get(env.GPU_MEMORY_STANDIN) or None,
                        help="read each process's GPU memory from <dir>/<pid> files instead of NVML (a stand-in for "
                             f"machines without a GPU; default ${env.GPU_MEMORY_STANDIN})")
    parser.add_argument("--gpu-mem-limit-mib", type=int, default=DEFAULT_PROCESS_LIMIT_BYTES >> 20,
                        help="each process of a job may keep this much GPU memory (its CUDA context) when the "
                             "node is released (default: two CUDA contexts as NVML reports them)")
    parser.add_argument("--memory-wait-s", type=float, default=30.0,
                        help="longest wait for a job's GPU memory to drop before releasing anyway")
    parser.add_argument("--heartbeat-s", type=float, default=0.5, help="coordinator heartbeat period")
    parser.add_argument("--event-log", default=None, help="append node events as JSON lines to this file")
    parser.add_argument("--ready-file", default=None,
                        help="write the socket path here once connected to the coordinator and serving")
    parser.add_argument("--secret-file", default=None,
                        help=f"file holding the coordinator's bootstrap secret; the node token is derived from it "
                             f"(default ${coord_env.SECRET_FILE} names the file, else ${coord_env.BOOTSTRAP_SECRET} "
                             "holds the secret; unset: the coordinator has no secret)")
    parser.add_argument("--allow-uid", type=int, action="append", default=[],
                        help="also serve local processes of this user id (repeatable; the sidecar's own uid is "
                             "always allowed; checked with SO_PEERCRED on every connection)")
    parser.add_argument("--allow-group", action="append", default=[],
                        help="also serve local processes in this group, name or gid (repeatable)")
    parser.add_argument("--tls-ca", default=None,
                        help="PEM CA certificate: talk TLS to the coordinator and verify it with this CA (the "
                             "coordinator's --tls-cert must name the --coordinator host)")
    parser.add_argument("--connect-wait-s", type=float, default=30.0,
                        help="after this long without a coordinator stream, say so (and keep retrying)")
    parser.add_argument("--log-level", default="warning")


def default_socket_path(socket_dir: str | None = None) -> tuple[str, str | None]:
    """The default socket path and, when it had to fall back to a temp dir, a message saying why."""
    from rollmux.sidecar import env
    from rollmux.wire import env as coord_env

    wanted = socket_dir or os.environ.get(env.SOCKET_DIR) or DEFAULT_SOCKET_DIR
    try:
        os.makedirs(wanted, mode=0o755, exist_ok=True)
        if os.access(wanted, os.W_OK):
            return os.path.join(wanted, SOCKET_NAME), None
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"rollmux-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    return (os.path.join(fallback, SOCKET_NAME),
            f"rollmux sidecar: {wanted} is not writable, serving on {fallback}/{SOCKET_NAME} instead; point "
            f"ranks at it with {coord_env.SIDECAR_SOCKET}={fallback}/{SOCKET_NAME} (or run as a user who can write "
            f"{wanted}, or pass --socket)")


def run(args: argparse.Namespace) -> int:
    import logging

    from rollmux.core.model import ClusterSpec, Pool
    from rollmux.sidecar.agent import AgentConfig, NodeAgent
    from rollmux.sidecar.gpu import UnknownGpuError, detect
    from rollmux.sidecar.peercred import PeerPolicy, resolve_group
    from rollmux.sidecar.server import serve
    from rollmux.wire import auth
    from rollmux.wire.auth import read_secret
    from rollmux.wire.client import CoordinatorClient

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.coordinator:
        print("rollmux sidecar: give --coordinator HOST:PORT (or set ROLLMUX_COORDINATOR)", file=sys.stderr)
        return 2
    try:
        secret = read_secret(args.secret_file)
        policy = PeerPolicy(uids=frozenset(args.allow_uid),
                            gids=frozenset(resolve_group(g) for g in args.allow_group))
    except ValueError as exc:
        print(f"rollmux sidecar: {exc}", file=sys.stderr)
        return 2
    path = args.socket
    if path is None:
        path, note = default_socket_path()
        if note:
            print(note, file=sys.stderr)
    if len(path) > MAX_SOCKET_PATH:
        print(f"rollmux sidecar: socket path {path!r} is {len(path)} characters, longer than the {MAX_SOCKET_PATH} "
              "a Unix socket allows: pass a shorter --socket", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pool = Pool(args.pool)
    gpu_type = args.gpu_type or ClusterSpec().gpu_for(pool).name
    try:
        gpu = detect(gpu_type, args.gpu_count, use_nvml=not args.no_nvml, memory_standin_dir=args.gpu_memory_standin,
                     gpu_type_given=args.gpu_type is not None)
    except UnknownGpuError as exc:
        print(f"rollmux sidecar: {exc}", file=sys.stderr)
        return 2
    config = AgentConfig(node_id=args.node_id, pool=pool, gpu_mem_limit_bytes=args.gpu_mem_limit_mib << 20,
                         memory_wait_s=args.memory_wait_s, heartbeat_s=args.heartbeat_s, event_log=args.event_log)
    try:
        root_certificates = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    except OSError as exc:
        print(f"rollmux sidecar: cannot read --tls-ca {args.tls_ca}: {exc.strerror}", file=sys.stderr)
        return 2
    client = CoordinatorClient([t.strip() for t in args.coordinator.split(",") if t.strip()], retry_s=10.0,
                               root_certificates=root_certificates)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    node_token = auth.node_token(secret, args.node_id) if secret else None
    agent = NodeAgent(config, client, gpu, node_token=node_token).start()
    server = serve(agent, path, policy=policy)
    try:
        code = _wait_connected(agent, args, done)
        if code is not None:
            return code
        _announce(args, path, gpu)
        done.wait()
    finally:
        server.stop(grace=1.0)
        agent.stop()
    return 0


def _wait_connected(agent: Any, args: argparse.Namespace, done: threading.Event) -> int | None:
    """Wait for the coordinator stream, interruptible by SIGTERM; None once connected, else an exit code.

    A refusal of the node's credential is final (exit 3, naming the coordinator's answer); anything
    else is retried, and reported with the last error once `--connect-wait-s` has passed.
    """
    from rollmux.wire.errors import PermissionDeniedError, UnauthenticatedError

    warn_at = time.monotonic() + args.connect_wait_s
    while not done.is_set():
        if agent.wait_connected(0.2):
            return None
        err = agent.connect_error()
        if isinstance(err, (PermissionDeniedError, UnauthenticatedError)):
            print(f"rollmux sidecar: the coordinator at {args.coordinator} refused node {args.node_id}: {err}. "
                  "Give the sidecar the coordinator's bootstrap secret (--secret-file, or the variables named in "
                  "--help)", file=sys.stderr, flush=True)
            return 3
        if time.monotonic() >= warn_at:
            warn_at = float("inf")
            print(f"rollmux sidecar: node {args.node_id} cannot reach the coordinator at {args.coordinator} yet "
                  f"({err or 'no answer'}); still retrying (check the address and that `rollmux coordinator` "
                  "runs)", file=sys.stderr, flush=True)
    return 0


def _announce(args: argparse.Namespace, path: str, gpu: Any) -> None:
    from rollmux.wire import env as coord_env

    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(path)
        os.replace(tmp, args.ready_file)
    print(f"rollmux sidecar: node {args.node_id} ({args.pool}, {gpu.facts().gpu_type} x{gpu.facts().gpu_count}, "
          f"nvml={'yes' if gpu.available else 'no'}) serving ranks on {path}; ranks opt in with "
          f"{coord_env.SIDECAR_SOCKET}={path}", file=sys.stderr, flush=True)
