"""`rollmux status`: groups, jobs, per-node queues and leases of a running coordinator."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollmux.core.model import Lease

HELP = "Show the coordinator's groups, jobs (state, group, deployment mode, next phase, lease), per-node queues and leases."


def configure(parser: argparse.ArgumentParser) -> None:
    from rollmux.wire import env

    parser.add_argument("--coordinator", default=os.environ.get(env.COORDINATOR, "127.0.0.1:50051"),
                        help=f"HOST:PORT[,HOST:PORT] (${env.COORDINATOR})")
    parser.add_argument("--token", default=os.environ.get(env.TOKEN), help=f"operator token (${env.TOKEN})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--tls-ca", default=None, help="PEM CA certificate of a coordinator serving TLS")
    parser.add_argument("--timeout", type=float, default=5.0, help="give up after this many seconds")


def _lease(lease: Lease | None) -> str:
    return "-" if lease is None else f"{lease.job} {lease.phase.value}({lease.iteration}) e{lease.epoch}"


def run(args: argparse.Namespace) -> int:
    from rollmux.wire import convert
    from rollmux.wire.client import CoordinatorClient
    from rollmux.wire.errors import ServiceError

    try:
        root_certificates = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    except OSError as exc:
        print(f"rollmux status: cannot read --tls-ca {args.tls_ca}: {exc.strerror}", file=sys.stderr)
        return 2
    client = CoordinatorClient(args.coordinator.split(","), token=args.token, retry_s=args.timeout,
                               root_certificates=root_certificates)
    try:
        state = client.cluster_state()
    except ServiceError as exc:
        print(f"rollmux status: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        print(json.dumps(convert.cluster_info_to_dict(state), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"ready: {state.ready}  leader fence: {state.leader_fence}  "
                  f"provisioned: ${state.usd_per_h:,.2f}/h  pending: {', '.join(state.pending) or '-'}")
    groups = Table(title="groups")
    for col in ("group", "jobs (round-robin)", "rollout nodes", "train nodes", "$/h"):
        groups.add_column(col)
    for g in state.groups:
        groups.add_row(g.group_id, " ".join(g.jobs), " ".join(g.rollout_nodes), " ".join(g.train_nodes),
                       f"{g.usd_per_h:,.2f}")
    jobs = Table(title="jobs")
    for col in ("job", "state", "group", "mode", "next phase", "permit", "lease", "obs roll s", "obs train s"):
        jobs.add_column(col)
    for j in state.jobs:
        jobs.add_row(j.job, j.state, j.group_id or "-", j.deployment or "-",
                     f"{j.next_phase.value}({j.next_iteration})", j.permit_state,
                     _lease(j.lease), f"{j.observed_roll_s:.2f}",
                     f"{j.observed_train_s:.2f}")
    nodes = Table(title="nodes")
    for col in ("node", "pool", "state", "sidecar", "group", "holder (lease)", "queue (head first)"):
        nodes.add_column(col)
    for n in state.nodes:
        nodes.add_row(n.node_id, n.pool.value, n.state, "up" if n.connected else "-",
                      n.group_id or "-", _lease(n.holder), " ".join(n.queue) or "-")
    for table in (groups, jobs, nodes):
        console.print(table)
    return 0
