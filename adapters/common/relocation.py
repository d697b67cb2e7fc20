"""Honouring a relocation directive by checkpoint, exit and restart: the framework-independent part.

The coordinator may move a running job to another group (docs/concepts/relocation-and-migration.md).
A framework job's devices are held by its Ray workers on the nodes it started on, so an adapter moves
it the way the framework resumes (docs/how-to/run-verl.md and docs/how-to/run-roll.md, "Relocation"): it saves the
framework's own checkpoint at the end of Sync(i) while the nodes are still the job's, acknowledges
before Rollout(i+1) (:func:`acknowledge`), and once switched writes :data:`MARKER` (:func:`write_marker`)
and leaves with :class:`JobRelocated`; the driver exits :data:`EXIT_RELOCATED`
(:func:`exit_on_relocation`). The platform restarts the same command on the new nodes: an
operator-registered job with the same ``ROLLMUX_JOB`` / ``ROLLMUX_JOB_TOKEN``; a self-registered one
(the marker says ``relayed``) registers again through the new node's sidecar under the name in the
marker (:func:`restart_name`, :func:`register`), and the coordinator answers the same job with a fresh
token (docs/design/architecture.md, "Relocation in the service"). The adapter finds the marker
(:func:`marker_for`) and resumes at Rollout(i+1).

The framework adapters supply where the checkpoint is taken, where the marker lives, and how the
restart resumes: ``rollmux.adapters.verl.relocation`` and ``rollmux.adapters.roll.relocation``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rollmux.adapters.common import registration
from rollmux.adapters.common.api import AdapterError
from rollmux.core.errors import RollMuxError
from rollmux.shim import env
from rollmux.shim.registration import Registration

log = logging.getLogger(__name__)

EXIT_RELOCATED = 75
"""The driver's exit status after a relocation (``EX_TEMPFAIL``): restart the job on its new nodes."""

MARKER = "rollmux-relocated.json"
"""Written beside the job's checkpoint when the job was switched: what a restart resumes from."""

BOUNDARY_WAIT_S = 5.0
"""How long the acknowledgement is retried while the coordinator has not yet seen the Sync release."""


class JobRelocated(RollMuxError):
    """The job was switched to other nodes: it checkpointed and stops; restart it there (exit 75)."""


class _Leave(Exception):
    """Raised from ``rollmux.relocate``'s checkpoint callback: the process leaves instead of re-attaching."""


def record(event: str, **fields: Any) -> None:
    """Append an adapter record (no ``owner`` key: phase readers skip it) to ``ROLLMUX_EVENT_LOG``."""
    path = os.environ.get(env.EVENT_LOG)
    if not path:
        return
    rec = {"kind": "adapter", "event": event, "pid": os.getpid(), "t": round(time.time(), 6), **fields}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


def acknowledge(on_switched: Callable[[Any], None], *, wait_s: float = BOUNDARY_WAIT_S) -> bool:
    """Acknowledge this process's pending directive at an iteration boundary (outside any phase).

    Args:
        on_switched: called with the switched ``rollmux.core.model.Relocation`` before this process leaves
            (it writes the marker); the rank does not re-attach to its new node.
        wait_s: keep acknowledging this long while the coordinator has not yet seen the boundary.

    Returns:
        True when the coordinator switched the job (this process must leave); False when it stays
        (cancelled, expired, or not at a boundary for the coordinator yet).
    """
    import rollmux

    def leave() -> None:
        on_switched(rollmux.relocation())
        raise _Leave

    try:
        rollmux.relocate(checkpoint=leave, wait_s=wait_s)
    except _Leave:
        return True
    return False


def marker_record(job: str, directive: Any, *, iteration: int, step: int, run: str, **extra: Any) -> dict[str, Any]:
    """The marker's content: the switched directive, the iteration to resume at (the next Rollout),
    the framework's step counter there, and the run that wrote it (its exit status checks it)."""
    d = directive
    return {"job": job, "epoch": d.epoch, "switched_epoch": d.switched_epoch, "from_group": d.from_group,
            "to_group": d.to_group, "rollout_nodes": list(d.rollout_nodes), "train_nodes": list(d.train_nodes),
            "iteration": iteration, "step": step, "run": run, **extra, "t": round(time.time(), 6)}


def write_marker(path: str, rec: dict[str, Any]) -> None:
    """Write the marker atomically (a restart never reads half of it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def read_marker(path: str) -> dict[str, Any] | None:
    """The marker at `path`, or None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def marker_for(path: str, job: str) -> dict[str, Any] | None:
    """The marker at `path` when it was written for `job` (a restart of a relocated job), else None."""
    marker = read_marker(path)
    return marker if marker is not None and marker.get("job") == job else None


def restart_name(path: str) -> str | None:
    """The job name to register under when this run restarts a relocated self-registered job: the one
    recorded in the marker at `path` (None: no such marker, an operator token is set, or ``ROLLMUX_JOB``
    names another job). The driver registers it through its node's sidecar with the same spec
    (:func:`register`); the coordinator answers the same job with a fresh token."""
    marker = read_marker(path)
    if marker is None or not marker.get("relayed") or not marker.get("job") or os.environ.get(env.JOB_TOKEN):
        return None
    given = os.environ.get(env.JOB, "")
    return None if given and given != marker["job"] else str(marker["job"])


def register(spec: Any, *, marker: str, restarted: bool) -> Registration:
    """Register the job (``registration.register``); `restarted` when its name came from the marker at
    `marker` (:func:`restart_name`): the registration re-attaches the relocated job with a fresh token.

    Raises:
        AdapterError: a restart the coordinator refused to re-attach (says what to do).
        SidecarError: as ``registration.register``, for a job that is not a restart.
    """
    try:
        identity = registration.register(spec)
    except RollMuxError as exc:
        if not restarted:
            raise
        raise AdapterError(f"RollMux: job {spec.name!r} was relocated (marker {marker}) and could not re-attach "
                           f"through this node's sidecar: {exc}; start it on one of the nodes the marker names, "
                           "with the same config, or delete the marker to register a new job") from None
    if restarted:
        log.warning("RollMux: job %s re-attached after its relocation (fresh token)", identity.job)
    return identity


def restart_how(relayed: bool) -> str:
    """How the restart attaches as the same job, for the message a relocated job leaves with."""
    return ("it registers again through that node's sidecar under the name in the marker" if relayed
            else "with the same ROLLMUX_JOB and ROLLMUX_JOB_TOKEN")


def consume_marker(path: str) -> None:
    """Delete the marker once the resumed Rollout was granted on the new nodes (the move is done)."""
    if path and os.path.exists(path):
        os.remove(path)


def exit_on_relocation(path: str, run: str) -> None:
    """Make the driver's exit status :data:`EXIT_RELOCATED` when run `run` wrote the marker at `path`.
    Register it after ``ray.init`` (atexit runs it before Ray's own handler: it shuts Ray down first)."""
    import atexit

    atexit.register(_exit_status, path, run)


def _exit_status(path: str, run: str) -> None:
    import sys

    marker = read_marker(path)
    if marker is None or marker.get("run") != run:
        return
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_RELOCATED)
