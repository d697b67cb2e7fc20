"""A veRL GRPO job with ``trainer.nnodes=2`` (one fake GPU per node) on the multi-node Ray cluster, through
the CPU harness of ``tests/adapters/verl/harness``.

The driver connects to the cluster's head (``ray_kwargs.ray_init.address``: no ``num_cpus`` /
``num_gpus``, which Ray refuses when connecting). Worker processes inherit their environment from
their raylet, not from the driver: :func:`raylet_env` is what every raylet gets for the harness to
load in them, and each node's own sidecar socket comes on top (``deployment.py``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "adapters" / "verl" / "harness"
if str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))

from job import REPO, VerlJob  # noqa: E402
from raynodes import AUTH  # noqa: E402

from rollmux.sidecar import env  # noqa: E402

_REPLACED = ("trainer.nnodes=", "trainer.n_gpus_per_node=", "+ray_kwargs.ray_init.num_gpus=",
             "ray_kwargs.ray_init.num_cpus=", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=")
"""Single-node overrides of the harness job that a job on an existing multi-node cluster replaces (each
rank gets ``batch / nnodes`` samples, so its micro-batch is that size)."""


def raylet_env(events: Path) -> dict[str, str]:
    """The harness variables for every raylet (so for every worker process): the CPU platform and the
    harness module, gloo on loopback, the harness's own event file."""
    return {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rollmux_verl_cpu",
            "PYTHONPATH": os.pathsep.join([str(HARNESS), str(REPO)]), "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
            "GLOO_SOCKET_IFNAME": "lo", "RMX_HARNESS_EVENTS": str(events)}


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiNodeJob(VerlJob):
    """The harness job on `address` with `nnodes` nodes of one GPU; `opted_out` keeps RollMux off in its
    workers although their raylets name a sidecar (a solo run on the shared cluster)."""

    address: str = ""  # the cluster's GCS address
    nnodes: int = 2
    opted_out: bool = False

    def environ(self, opt_in: dict[str, str] | None = None) -> dict[str, str]:
        return {**VerlJob.environ(self, opt_in), **AUTH}

    def overrides(self) -> list[str]:
        base = [o for o in VerlJob.overrides(self) if not o.startswith(_REPLACED)]
        micro = max(1, self.batch // self.nnodes)
        out = [*base, f"trainer.nnodes={self.nnodes}", "trainer.n_gpus_per_node=1",
               f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
               f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
               f"+ray_kwargs.ray_init.address={self.address}"]
        if self.opted_out:  # the job-level runtime env wins over the raylet's variable: opt-in off
            out.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{env.SIDECAR_SOCKET}=''")
        return out
