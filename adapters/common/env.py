"""Environment variables of the framework adapters, each named once.

The opt-in and the job's identity are the execution plane's (``rollmux.shim.env``:
``ROLLMUX_SIDECAR_SOCKET``, ``ROLLMUX_JOB``, ``ROLLMUX_JOB_TOKEN``, ``ROLLMUX_DEPLOYMENT``); the ones below are the
adapters' own. None of them carries a secret.
"""

from __future__ import annotations

SLO = "ROLLMUX_SLO"
"""Optional: the job's SLO factor, max slowdown vs running alone (default 1.5 = at most 50% slower)."""

PHASE_S = "ROLLMUX_PHASE_S"
"""Optional: the job's solo phase times in seconds, ``ROLLOUT,TRAIN`` (e.g. ``40,95``, measured in a run
alone). They replace the coordinator's estimate from model size, tokens and GPU type, a worst case
sized for GPUs. Default: the estimate."""

ROLLOUT_SIDECAR_SOCKET = "ROLLMUX_ROLLOUT_SIDECAR_SOCKET"
"""Optional: the rollout pool's sidecar socket for a disaggregated job whose trainer loop runs on a
training node of the same host (single-machine setups run one sidecar per pool on one host).
Default: the rollout phase is gated through ``ROLLMUX_SIDECAR_SOCKET``."""
