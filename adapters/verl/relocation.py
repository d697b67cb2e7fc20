"""Honouring a relocation directive in an unmodified veRL job: veRL's checkpoint, exit, restart, resume.

The coordinator may move a running job to another group (docs/concepts/relocation-and-migration.md).
A veRL job's GPUs are held by its Ray workers (FSDP actor, rollout replicas) on the nodes it started
on; veRL cannot move them, so the job moves the way veRL resumes (docs/how-to/run-verl.md, "Relocation"):

1. At the end of Sync(i), inside its permit (the job's nodes are still its own), the trainer loop
   sees the pending directive (``rollmux.relocation()``) and saves veRL's own checkpoint
   (``trainer._save_checkpoint()``: ``default_local_dir/global_step_<i+1>``, the step just done).
2. It releases Sync(i); veRL ends its step (metrics logged). Before Rollout(i+1) is asked for, the
   trainer loop acknowledges (``rollmux.relocate``). The coordinator switches the job's membership
   only there, between Sync(i) and Rollout(i+1): the old nodes no member needs are released, the
   job keeps its next phase, Rollout(i+1).
3. Switched, the trainer loop writes :data:`MARKER` beside the checkpoint (job, directive, the
   iteration to resume at, the new nodes), detaches without deregistering and stops ``fit`` with
   :class:`JobRelocated`; the driver exits with :data:`EXIT_RELOCATED`.
4. The platform starts the job again on its new nodes with ``trainer.resume_mode=auto``: veRL resumes
   from that checkpoint, the driver finds the marker, and the trainer loop asks for Rollout(i+1) on
   the new node's sidecar. An operator-registered job keeps its ``ROLLMUX_JOB`` / ``ROLLMUX_JOB_TOKEN``;
   a self-registered one (the marker says ``relayed``) registers again through the new node's sidecar
   with the job name recorded in the marker and the same spec (:func:`restart_name`): the coordinator
   answers the same job with a fresh token (docs/design/architecture.md, "Relocation in the service"),
   which goes where any self-registered job's token goes (the job's Ray instance's memory).

The framework-independent part (marker, acknowledgement, exit status 75) is shared with the ROLL
adapter: :mod:`rollmux.adapters.common.relocation`.

A directive the job cannot honour this way is declined (recorded once): the job does not acknowledge,
the directive expires and the job keeps its place. Declined: ``trainer.resume_mode`` other than
``auto``, ``colocate_async`` (not tested), and the last step.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rollmux.adapters.common.relocation import (
    BOUNDARY_WAIT_S,
    EXIT_RELOCATED,
    MARKER,
    JobRelocated,
    acknowledge,
    exit_on_relocation,
    marker_for,
    marker_record,
    read_marker,
    record,
    restart_how,
    write_marker,
)
from rollmux.adapters.common.relocation import restart_name as common_restart_name

__all__ = ["BOUNDARY_WAIT_S", "EXIT_RELOCATED", "MARKER", "MARKER_ENV", "RELAYED_ENV", "RESUME_ENV", "RUN_ENV",
           "JobRelocated", "at_rollout_begin", "at_sync_end", "driver_env", "marker_path", "read_marker",
           "restart_name", "why_not"]

MARKER_ENV = "ROLLMUX_VERL_RELOCATION_MARKER"
"""Set by the driver for the job's actors: the marker's absolute path (unset: relocation declined)."""

RUN_ENV = "ROLLMUX_VERL_RUN"
"""Set by the driver: this run's id, written into the marker (the driver's exit status checks it)."""

RESUME_ENV = "ROLLMUX_VERL_RESUME_ITERATION"
"""Set by the driver of a restarted job: the iteration it resumes at (its next Rollout)."""

RELAYED_ENV = "ROLLMUX_VERL_RELAYED"
"""Set by the driver ("1") when the job registered itself through the sidecar: written into the marker,
so that the restart registers again under the recorded name (:func:`restart_name`)."""


def marker_path(config: Any) -> str:
    """The marker's absolute path for a veRL config (``trainer.default_local_dir``, as veRL resolves it)."""
    from rollmux.adapters.verl import spec

    folder = str(spec.get(config, "trainer.default_local_dir", "checkpoints"))
    return os.path.join(os.path.abspath(folder), MARKER)


def why_not(trainer: Any, tracker: Any) -> str | None:
    """Why this job cannot honour a directive at this Sync's end (None: it can)."""
    from rollmux.adapters.verl import spec

    if not os.environ.get(MARKER_ENV):
        return f"{MARKER_ENV} is unset: the job's driver did not start through RollMux's veRL hook"
    cfg = getattr(trainer, "config", None)
    if cfg is None or not hasattr(trainer, "_save_checkpoint"):
        return "no veRL trainer seen yet"
    mode = spec.trainer_mode(cfg)
    if mode == "colocate_async":
        return "trainer.v1.trainer_mode=colocate_async: relocation through checkpoint/resume is not tested there"
    resume = str(spec.get(cfg, "trainer.resume_mode", "auto"))
    if resume != "auto":
        return f"trainer.resume_mode={resume}: a restart would not resume from the relocation checkpoint"
    steps, total = int(getattr(trainer, "global_steps", 0) or 0), int(getattr(trainer, "total_training_steps", 0) or 0)
    if steps != tracker.iteration + 1:
        return f"veRL is at step {steps}, not {tracker.iteration + 1} (Sync({tracker.iteration}))"
    if total and steps >= total:
        return "the last step: the job ends here"
    return None


def at_sync_end(r: Any) -> None:
    """Close the open Sync of runner `r`; with a directive pending that the job can honour, first save
    veRL's checkpoint inside the Sync permit (the job's nodes are still its own)."""
    import rollmux

    t = r.tracker
    d = rollmux.relocation() if t.current == "sync" else None
    if d is None or d.epoch in r.declined:
        t.end("sync")
        return
    reason = why_not(r.trainer, t)
    if reason is not None:
        r.declined.add(d.epoch)
        record("relocation_declined", job=r.job, epoch=d.epoch, iteration=t.iteration, reason=reason)
        t.end("sync")
        return
    t0 = time.perf_counter()
    r.trainer._save_checkpoint()  # veRL's own: default_local_dir/global_step_<step>, latest_checkpointed_iteration
    r.relocating = d.epoch
    record("relocation_checkpoint", job=r.job, epoch=d.epoch, iteration=t.iteration, step=r.trainer.global_steps,
           seconds=round(time.perf_counter() - t0, 6))
    t.end("sync")


def at_rollout_begin(r: Any) -> None:
    """At the iteration boundary (Sync released, the next Rollout not asked for; veRL logged the step):
    acknowledge the directive runner `r` checkpointed for. Switched, the process leaves.

    Raises:
        JobRelocated: the coordinator switched the job; this process stops (the driver exits 75).
    """
    import rollmux

    epoch, it = r.relocating, r.tracker.iteration  # `it`: the Rollout the job resumes at
    r.relocating = None
    if acknowledge(lambda d: _write_marker(r, d, resume_at=it), wait_s=BOUNDARY_WAIT_S):
        raise _leave(r, epoch, it)
    now = rollmux.relocation()  # cancelled, expired, or not at a boundary for the coordinator yet: the job stays
    record("relocation_kept", job=r.job, epoch=epoch, iteration=it, state=None if now is None else now.state.value)


def _write_marker(r: Any, d: Any, *, resume_at: int) -> None:
    """The marker: the switched directive and where to resume (veRL's checkpoint ``global_step_<resume_at>``:
    veRL counts steps from 1, RollMux iterations from 0)."""
    write_marker(os.environ[MARKER_ENV], marker_record(r.job, d, iteration=resume_at, step=resume_at,
                                                       run=os.environ.get(RUN_ENV, ""),
                                                       relayed=os.environ.get(RELAYED_ENV) == "1"))


def _leave(r: Any, epoch: int, iteration: int) -> JobRelocated:
    """Detach without deregistering (the job stays registered, its next phase Rollout(iteration))."""
    from rollmux.shim import api as shim

    r.finished = True  # no more gates in this process; the job stays registered
    try:
        if r.own_gate is not None:  # the GPU ranks detach cleanly too (a dropped rank would deregister the job)
            r.own_gate.detach()
        if r.rollout_rank is not None:
            r.rollout_rank.close()
    finally:
        shim.shutdown(job_done=False)
    marker = read_marker(os.environ[MARKER_ENV]) or {}
    record("relocation_exit", job=r.job, epoch=epoch, iteration=iteration, train_nodes=marker.get("train_nodes"),
           rollout_nodes=marker.get("rollout_nodes"))
    how = restart_how(bool(marker.get("relayed")))
    return JobRelocated(f"RollMux relocated job {r.job!r} to {marker.get('to_group')} (nodes "
                       f"{marker.get('rollout_nodes')} / {marker.get('train_nodes')}): veRL's checkpoint of step "
                       f"{marker.get('step')} is saved; restart the job there ({how}) with "
                       f"trainer.resume_mode=auto (exit {EXIT_RELOCATED})")


# ------------------------------------------------------------------------------------------ driver side

def restart_name(config: Any) -> str | None:
    """The job name a restart of a relocated self-registered job registers under (the marker's; None
    otherwise): :func:`rollmux.adapters.common.relocation.restart_name` for this config's marker."""
    return common_restart_name(marker_path(config))


def driver_env(config: Any, job: str, relayed: bool) -> dict[str, str]:
    """The relocation variables for the job's actors, and the driver's exit status hook.

    Raises:
        AdapterError: this run restarts a relocated job but ``trainer.resume_mode`` is not ``auto``.
    """
    import uuid

    from rollmux.adapters.common import AdapterError
    from rollmux.adapters.verl import spec

    path, run = marker_path(config), uuid.uuid4().hex
    out = {MARKER_ENV: path, RUN_ENV: run}
    if relayed:
        out[RELAYED_ENV] = "1"
    marker = marker_for(path, job)
    if marker is not None:
        resume = str(spec.get(config, "trainer.resume_mode", "auto"))
        if resume != "auto":
            raise AdapterError(f"RollMux: job {job!r} was relocated at iteration {marker.get('iteration')} and must "
                               f"resume from its checkpoint ({os.path.dirname(path)}), but trainer.resume_mode="
                               f"{resume}: set trainer.resume_mode=auto")
        out[RESUME_ENV] = str(int(marker["iteration"]))
    exit_on_relocation(path, run)  # after Ray's own handler is registered: runs before it
    return out
