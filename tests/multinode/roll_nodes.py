"""A real ROLL RLVR job whose actor_train and actor_infer span two nodes (one fake GPU each) of the multi-node
Ray cluster, through the CPU harness of ``tests/adapters/roll/harness``.

The raylets run ``.venv-roll``'s Ray (ROLL pins its own Ray), so the cluster is started with that venv's
``ray``; the driver connects to it (``--ray-address``) instead of starting a private Ray. Worker processes
take their environment from their raylet: :func:`raylet_env` is what every raylet gets for the harness's
CPU stand-in patches to load in them, and each node's own sidecar socket comes on top (``deployment.py``).
"""

from __future__ import annotations

from pathlib import Path

from raynodes import AUTH

from rollmux.shim import env
from tests.adapters.roll.testbed import HARNESS, ROLL_VENV, Job, launch

RAY_BIN = str(ROLL_VENV / "bin" / "ray")
NODES = 2
HEAD_CPUS = 4
"""The head's logical CPUs: ROLL pins its schedulers to the driver's node (NodeAffinity, not soft), and the
driver runs on the head. They hold no GPU, so they are no ranks; the GPU workers go to n1 and n2."""
PORT_BLOCK = "7"
"""``RMX_PORT_BLOCK`` of the cluster's workers (ports no single-node harness job of the same session takes
at once: those count blocks from 0)."""


def raylet_env(log_dir: Path) -> dict[str, str]:
    """The harness variables for every raylet (so for every ROLL worker): its stand-in patches, one fake GPU,
    gloo on loopback, one port block, ROLL's logs in `log_dir` (its default, ``./output/logs``, is relative to
    the raylet's working directory)."""
    return {"ROLL_LOG_DIR": str(log_dir), "PYTHONPATH": str(HARNESS), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "RAY_DEDUP_LOGS": "0", "RMX_FAKE_GPUS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo",
            "RMX_PORT_BLOCK": PORT_BLOCK, **AUTH}


def start_job(name: str, workdir: Path, *, address: str, opt_in: dict[str, str] | None) -> Job:
    """Start the 2-step, 2-node RLVR job's driver on `address` (opted in when `opt_in` names the driver
    node's sidecar socket and the rest of the job's variables)."""
    extra = {**AUTH, "RMX_PORT_BLOCK": PORT_BLOCK, **(opt_in or {})}
    if opt_in is None:
        extra[env.SIDECAR_SOCKET] = ""
    return launch(name, workdir, steps=2, extra_env=extra,
                  extra_args=["--ray-address", address, "--nodes", str(NODES)])
