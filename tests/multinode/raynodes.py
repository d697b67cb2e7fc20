"""A real multi-node Ray cluster on one host: one ``ray start --block`` raylet per node, each a child
process in its own session with its own environment (the node's sidecar socket in
``ROLLMUX_SIDECAR_SOCKET``, as a platform sets it in every pod of a node), its own resources and a
``rollmux.sim/node`` label naming the node.

Stopping never uses ``ray stop`` (it kills every Ray process on the host, other clusters' too): each
raylet gets SIGTERM with ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0``, then SIGKILL of whatever of
its session is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollmux.core.ports import free_port

LABEL = "rollmux.sim/node"
"""The Ray node label naming the node (the sidecar's node id)."""


AUTH = {"RAY_AUTH_MODE": "disabled"}
"""One authentication mode for every raylet and driver: unset, a head started after any local
``ray.init`` wrote ``~/.ray/auth_token`` turns token auth on, and joining raylets are refused."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RayNode:
    """One raylet of the cluster."""

    name: str  # node id (sidecar --node-id, Ray --node-name, label value)
    gpus: int  # logical Ray GPUs (fake: CPU torch ignores CUDA_VISIBLE_DEVICES)
    cpus: int  # logical Ray CPUs
    env: dict[str, str] = field(default_factory=dict)  # the raylet's own variables (its sidecar socket)


class RayNodesError(RuntimeError):
    """The cluster did not come up (the raylet logs are named)."""


class RayNodes:
    """Start the head node first, then the others; `address` is the GCS address drivers connect to.

    Args:
        workdir: raylet stdout/stderr logs.
        nodes: the head first.
        env: the variables every raylet gets (the harness's), under each node's own.
        ray_bin: the ``ray`` console script of the venv the jobs run in.
    """

    def __init__(self, workdir: Path, nodes: list[RayNode], *, env: dict[str, str], ray_bin: str) -> None:
        self.dir, self.nodes, self.env, self.ray_bin = workdir, nodes, env, ray_bin
        self.temp_dir = tempfile.mkdtemp(prefix="rmxmn-")  # short: Ray's socket paths must fit 107 bytes
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.address = ""

    def _argv(self, node: RayNode, head: bool) -> list[str]:
        common = ["--block", "--node-ip-address=127.0.0.1", f"--node-name={node.name}",
                  f"--labels={LABEL}={node.name}", f"--num-cpus={node.cpus}", f"--num-gpus={node.gpus}",
                  "--object-store-memory=200000000", "--dashboard-agent-listen-port=0",
                  f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                  f"--metrics-export-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0",
                  "--disable-usage-stats"]
        if head:
            return [self.ray_bin, "start", "--head", "--port=0", f"--temp-dir={self.temp_dir}",
                    "--include-dashboard=false", f"--ray-client-server-port={free_port()}", *common]
        return [self.ray_bin, "start", f"--address={self.address}", "--include-log-monitor=false", *common]

    def _spawn(self, node: RayNode, head: bool) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLMUX_", "VERL_", "RAY_ADDRESS"))}
        env.update(self.env)
        env.update(node.env)
        env.update({"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0", **AUTH})
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"raylet-{node.name}.log", "wb") as log:
            self.procs[node.name] = subprocess.Popen(self._argv(node, head), env=env, stdout=log,
                                                     stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 180.0) -> RayNodes:
        deadline = time.monotonic() + timeout_s
        head, *rest = self.nodes
        self._spawn(head, head=True)
        current = Path(self.temp_dir) / "ray_current_cluster"  # written before --block starts waiting
        while not current.exists() or not current.read_text().strip():
            self._check(deadline, head.name)
            time.sleep(0.2)
        self.address = current.read_text().strip()
        for i, node in enumerate(rest, start=2):  # one after another: two joining at once time out here
            self._spawn(node, head=False)
            while len(self.alive()) < i:
                self._check(deadline, node.name)
                time.sleep(0.5)
        return self

    def _check(self, deadline: float, what: str) -> None:
        dead = [n for n, p in self.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RayNodesError(f"Ray node {what} did not come up (exited: {dead}); see {self.dir}/raylet-*.log")

    def alive(self) -> dict[str, str]:
        """Node name -> Ray node id of every live node (asked of the GCS, no driver attached)."""
        from ray._raylet import GcsClient

        try:
            infos = GcsClient(address=self.address).get_all_node_info(timeout=5)
        except Exception:  # noqa: BLE001 - the GCS is still starting
            return {}
        out = {}
        for node_id, info in infos.items():
            if info.state == 0:  # GcsNodeInfo.ALIVE
                out[info.node_name] = node_id.hex()
        return out

    def stop(self) -> None:
        """SIGTERM each raylet (workers first, head last), then SIGKILL what is left of its session."""
        for name in [n.name for n in reversed(self.nodes)]:
            p = self.procs.get(name)
            if p is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for pid in self.leftover_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if os.environ.get("RMX_KEEP_RAY_TMP") is None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        """Processes still running whose command line names this cluster's temp dir (its Ray processes)."""
        marker = self.temp_dir.encode()
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker in f.read():
                        out.append(int(d))
            except OSError:
                continue
        return out


if __name__ == "__main__":  # a manual check: start three nodes, print them, stop
    nodes = RayNodes(Path(tempfile.mkdtemp()), [RayNode(name="n0", gpus=0, cpus=4),
                                                 RayNode(name="n1", gpus=1, cpus=6),
                                                 RayNode(name="n2", gpus=1, cpus=6)],
                     env={}, ray_bin=str(Path(sys.executable).parent / "ray"))
    t0 = time.monotonic()
    try:
        nodes.start()
        print(f"up in {time.monotonic() - t0:.1f}s at {nodes.address}: {nodes.alive()}")
    finally:
        nodes.stop()
        print(f"stopped; left: {nodes.leftover_pids()}")
