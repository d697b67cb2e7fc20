"""A multi-node RollMux deployment on one host, all real processes: redis-server, the coordinator on it
(bootstrap secret, one GPU per node), one sidecar per node (``--secret-file``, as the Helm chart runs
them) and a Ray cluster with one raylet per node whose environment names that node's sidecar socket.

Nodes: ``n0`` is the head (no GPU; the drivers and veRL's TaskRunner land there; a rollout-pool node
to the coordinator), ``n1`` and ``n2`` each have one fake GPU and are training-pool nodes, so that a
co-located job (veRL's hybrid engine) with ``trainer.nnodes=2`` is placed on exactly them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raynodes import RayNode, RayNodes

from rollmux.shim import env
from rollmux.testing.chaos.procs import CoordinatorProcess, RedisProcess, SidecarProcess

SECRET = "multinode-bootstrap-secret"
NODES = (("n0", "rollout", 0), ("n1", "train", 1), ("n2", "train", 1))
"""(node id, pool, Ray GPUs) of each node, the head first."""
HEAD_CPUS, WORKER_CPUS = 0, 8
"""Logical Ray CPUs: a veRL worker bundle takes 3 CPUs, its rollout server none. The head gets none, so
the job's controller (veRL's TaskRunner, a rank that gates the phases) runs on one of the job's own
nodes: a rank attached on a node outside the job's placement is refused (I4), and Ray would otherwise
put the unpinned TaskRunner on the head now and then."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    """What a test needs of the running deployment."""

    dir: Path  # logs and event files
    ray: RayNodes  # the Ray cluster (``ray.address`` for drivers)
    coordinator: CoordinatorProcess
    sockets: dict[str, str]  # node id -> its sidecar socket
    node_events: Path  # every sidecar's events (JSON lines with "node")
    secret_file: Path

    @property
    def address(self) -> str:
        return self.ray.address


@contextlib.contextmanager
def multinode(workdir: Path, *, raylet_env: dict[str, str], lease_ttl_s: float = 10.0,
              sidecar_args: tuple[str, ...] = (), ray_bin: str | None = None,
              head_cpus: int = HEAD_CPUS) -> Iterator[Deployment]:
    """Start everything (coordinator and sidecars first: a raylet's workers may attach at once), yield,
    stop everything in reverse order. `ray_bin`: the ``ray`` of the venv the jobs run in (default: this
    interpreter's); `head_cpus`: the head's logical CPUs (a ROLL driver pins its schedulers, no ranks, to
    its own node); `sidecar_args`: further flags for every sidecar."""
    workdir.mkdir(parents=True, exist_ok=True)
    secret = workdir / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    node_events = workdir / "nodes.jsonl"
    sock_dir = Path(workdir / "s")
    sock_dir.mkdir(exist_ok=True)
    redis = RedisProcess(workdir)
    coordinator = CoordinatorProcess(redis.url, workdir, instance_id="multinode",
                                     extra=["--secret-file", str(secret), "--gpus-per-node", "1",
                                            "--lease-ttl", str(lease_ttl_s)])
    sidecars: list[SidecarProcess] = []
    ray: RayNodes | None = None
    with contextlib.ExitStack() as stack:
        redis.start()
        stack.callback(redis.stop)
        coordinator.start()
        stack.callback(coordinator.stop)
        sockets = {}
        for node, pool, _ in NODES:
            sockets[node] = str(sock_dir / f"{node}.sock")
            sc = SidecarProcess(coordinator.address, workdir, node_id=node, pool=pool, socket_path=sockets[node],
                                extra=["--secret-file", str(secret), "--event-log", str(node_events),
                                       "--gpu-count", "1", *sidecar_args])
            sc.start(wait=False)
            stack.callback(sc.stop)
            sidecars.append(sc)
        for sc in sidecars:
            sc.wait_ready(120)
        ray = RayNodes(workdir / "ray", [RayNode(name=node, gpus=gpus, cpus=head_cpus if not gpus else WORKER_CPUS,
                                                 env={env.SIDECAR_SOCKET: sockets[node]})
                                         for node, _, gpus in NODES],
                       env=raylet_env, ray_bin=ray_bin or str(Path(sys.executable).parent / "ray"))
        stack.callback(ray.stop)
        ray.start()
        yield Deployment(dir=workdir, ray=ray, coordinator=coordinator, sockets=sockets, node_events=node_events,
                         secret_file=secret)


def cluster_jobs(dep: Deployment) -> list[Any]:
    """The jobs the coordinator knows now (its cluster state, asked with the operator's token)."""
    from rollmux.wire.auth import operator_token
    from rollmux.wire.client import CoordinatorClient

    client = CoordinatorClient(dep.coordinator.address, token=operator_token(dep.secret_file.read_text()))
    try:
        return list(client.cluster_state().jobs)
    finally:
        client.close()
