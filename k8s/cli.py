"""`rollmux scheduler`: the RollMux Kubernetes scheduler (a secondary scheduler for opted-in job pods).

One active replica: the chart runs a single replica with the Recreate strategy. A second one would
race for the same gangs; each Binding is guarded by the API server (409 for a bound pod), so nothing
is double-bound, but both would register jobs and explain pods.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

HELP = "Run the RollMux Kubernetes scheduler: bind opted-in job pods to the nodes the coordinator places them on."


def configure(parser: argparse.ArgumentParser) -> None:
    from rollmux.k8s.api import SCHEDULER_NAME
    from rollmux.wire import env

    parser.add_argument("--coordinator", default=os.environ.get(env.COORDINATOR, "127.0.0.1:50051"),
                        help=f"HOST:PORT[,HOST:PORT] of the coordinator (${env.COORDINATOR})")
    parser.add_argument("--secret-file", default=None,
                        help="file holding the coordinator's bootstrap secret (the operator token derives from it; "
                             f"default ${env.SECRET_FILE}, else ${env.BOOTSTRAP_SECRET}; unset: no secret)")
    parser.add_argument("--tls-ca", default=None, help="PEM CA certificate of a coordinator serving TLS")
    parser.add_argument("--scheduler-name", default=SCHEDULER_NAME, help="the pods' spec.schedulerName to serve")
    parser.add_argument("--kube-server", default="",
                        help="API server URL (default: in-cluster, from the service account)")
    parser.add_argument("--kube-token-file", default="", help="bearer token file for --kube-server")
    parser.add_argument("--kube-ca", default="", help="CA file for --kube-server")
    parser.add_argument("--kube-insecure", action="store_true", help="skip TLS verification (loopback tests only)")
    parser.add_argument("--resync", type=float, default=1.0, help="seconds between looks at waiting gangs")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    from rollmux.k8s.kube import KubeClient, KubeConfig, KubeError
    from rollmux.k8s.scheduler import Scheduler, SchedulerConfig
    from rollmux.wire import auth
    from rollmux.wire.client import CoordinatorClient

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        secret = auth.read_secret(args.secret_file)
        if args.kube_server:
            token = open(args.kube_token_file).read().strip() if args.kube_token_file else ""  # noqa: SIM115
            kube = KubeClient(KubeConfig(server=args.kube_server, token=token, ca_file=args.kube_ca,
                                         insecure=args.kube_insecure))
        else:
            kube = KubeClient.in_cluster()
        root_certificates = open(args.tls_ca, "rb").read() if args.tls_ca else None  # noqa: SIM115
    except (OSError, KeyError, ValueError) as exc:
        print(f"rollmux scheduler: {exc}: give --kube-server (and --kube-token-file) outside a pod", file=sys.stderr)
        return 2
    coordinator = CoordinatorClient(args.coordinator.split(","), token=auth.operator_token(secret) if secret else None,
                                    root_certificates=root_certificates)
    scheduler = Scheduler(kube, coordinator, SchedulerConfig(scheduler_name=args.scheduler_name, resync_s=args.resync))
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=scheduler.metrics.registry)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: scheduler.stop())
    try:
        scheduler.start()
    except KubeError as exc:
        print(f"rollmux scheduler: cannot reach the API server: {exc}", file=sys.stderr)
        return 1
    loop = threading.Thread(target=scheduler.run, name="scheduling loop", daemon=True)
    loop.start()
    while loop.is_alive():
        loop.join(1.0)
    coordinator.close()
    return 0
