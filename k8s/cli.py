"""`rollmux scheduler`: the RollMux Kubernetes scheduler (a secondary scheduler for opted-in job pods).

Replicas elect a leader on a Lease (``--leader-elect``, the chart's default with 2 replicas): only the
holder registers jobs and binds; the others keep their caches warm and take over when it stops renewing.
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
    from rollmux.k8s.api import GPU_RESOURCE, POOL_LABEL, REPLICAS_LABEL, SCHEDULER_NAME
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
    parser.add_argument("--gpu-resource", default=GPU_RESOURCE,
                        help="the GPU extended resource pods request (nvidia.com/gpu.shared under time-slicing's "
                             "renameByDefault)")
    parser.add_argument("--pool-label", default=POOL_LABEL, help="the node label naming a node's pool")
    parser.add_argument("--replicas-label", default=REPLICAS_LABEL,
                        help="the node label giving time-slicing replicas per GPU")
    parser.add_argument("--gang-timeout", type=float, default=300.0,
                        help="seconds a placed gang may stay part-bound or unbindable before its bound pods are "
                             "evicted and its placement freed")
    parser.add_argument("--release-grace", type=float, default=30.0,
                        help="seconds after a registered job's last pod is gone (no driver attached) before "
                             "it is deregistered")
    parser.add_argument("--namespaces", default="", help="comma-separated namespaces to serve (default: all)")
    parser.add_argument("--leader-elect", action="store_true",
                        help="elect a leader among replicas on a coordination.k8s.io Lease")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                        help="namespace of the Lease ($POD_NAMESPACE)")
    parser.add_argument("--lease-name", default="rollmux-scheduler", help="name of the Lease")
    parser.add_argument("--metrics-port", type=int, default=9090,
                        help="port of /metrics, /livez and /readyz (0: off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    import socket

    from rollmux.k8s.api import Conventions
    from rollmux.k8s.health import HealthServer
    from rollmux.k8s.kube import KubeClient, KubeConfig, KubeError
    from rollmux.k8s.leader import LeaseConfig
    from rollmux.k8s.scheduler import Scheduler, SchedulerConfig
    from rollmux.wire import auth
    from rollmux.wire.client import CoordinatorClient

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        secret = auth.read_secret(args.secret_file)
        if args.kube_server:
            kube = KubeClient(KubeConfig(server=args.kube_server, token_file=args.kube_token_file,
                                         ca_file=args.kube_ca, insecure=args.kube_insecure))
            kube.token()  # a missing token file is an error now, not on the first call
        else:
            kube = KubeClient.in_cluster()
        root_certificates = open(args.tls_ca, "rb").read() if args.tls_ca else None  # noqa: SIM115
    except (OSError, KeyError, ValueError) as exc:
        print(f"rollmux scheduler: {exc}: give --kube-server (and --kube-token-file) outside a pod", file=sys.stderr)
        return 2
    coordinator = CoordinatorClient(args.coordinator.split(","), token=auth.operator_token(secret) if secret else None,
                                    root_certificates=root_certificates)
    lease = (LeaseConfig(namespace=args.lease_namespace, name=args.lease_name,
                         identity=os.environ.get("POD_NAME") or socket.gethostname()) if args.leader_elect else None)
    config = SchedulerConfig(
        scheduler_name=args.scheduler_name, resync_s=args.resync, gang_timeout_s=args.gang_timeout,
        release_grace_s=args.release_grace, lease=lease,
        namespaces=tuple(n for n in args.namespaces.split(",") if n),
        conventions=Conventions(gpu_resource=args.gpu_resource, pool_label=args.pool_label,
                                replicas_label=args.replicas_label))
    scheduler = Scheduler(kube, coordinator, config)
    if args.metrics_port:
        HealthServer("0.0.0.0", args.metrics_port, scheduler.metrics.registry, scheduler.health)  # noqa: S104
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
