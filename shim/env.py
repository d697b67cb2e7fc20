"""Environment variables the in-trainer shim reads, each named once.

Setting ``ROLLMUX_SIDECAR_SOCKET`` (:data:`SIDECAR_SOCKET`, declared with the sidecar protocol in
``rollmux.wire.env`` because the sidecar daemon reads it too) is the opt-in: without it every shim call
is a no-op.
"""

from __future__ import annotations

from rollmux.wire.env import SIDECAR_SOCKET

JOB = "ROLLMUX_JOB"
"""Optional. Name of the job this process belongs to, as registered with the coordinator (default: the
job this process registered with ``rollmux.register``)."""

JOB_TOKEN = "ROLLMUX_JOB_TOKEN"
"""Optional. The job token the coordinator returned at registration (authenticates the job's permit
calls); a driver that registered through the sidecar (``rollmux.register``) needs none and hands the
token to its workers' environment. Never log it or write it to disk."""

RANK = "ROLLMUX_RANK"
"""This process's rank inside its job (for logs; defaults to ``RANK`` or 0)."""

EVENT_LOG = "ROLLMUX_EVENT_LOG"
"""Optional file the shim appends one JSON line per phase to (job, rank, node, phase, times)."""

PERMIT_TIMEOUT_S = "ROLLMUX_PERMIT_TIMEOUT_S"
"""Longest wait for one permit, seconds (default 600)."""

SIDECAR_SOCKET_TEMPLATE = "ROLLMUX_SIDECAR_SOCKET_TEMPLATE"
"""Optional. Socket path of any node's sidecar with ``{node}`` for the node id (e.g.
``/run/rollmux/{node}.sock``, when one host runs several nodes' sidecars): where a relocated rank
re-attaches in place (``rollmux.relocate``). Unset: a rank whose node changes must be started on
its new node by the job's launcher, from the checkpoint it wrote."""

DEPLOYMENT = "ROLLMUX_DEPLOYMENT"
"""Set by the adapters and ``rollmux.register``'s callers, not by users: the job's deployment mode
(``rollmux.core.model.Deployment``: "disaggregated", "colocated-train" or "colocated-rollout"), handed to
the job's workers with its token. It decides which pool's rank asks for each phase's permit: a
co-located job's Rollout runs on its training (or rollout) nodes, so the rank there owns it.
Default: this process's registration, else "disaggregated"."""

__all__ = ["DEPLOYMENT", "EVENT_LOG", "JOB", "JOB_TOKEN", "PERMIT_TIMEOUT_S", "RANK", "SIDECAR_SOCKET",
           "SIDECAR_SOCKET_TEMPLATE"]
