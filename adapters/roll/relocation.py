"""Honouring a relocation directive in an unmodified ROLL RLVR or agentic job: ROLL's checkpoint, exit, restart, resume.

A ROLL job's devices are held by its clusters' Ray workers on the nodes it started on, so the job
moves the way ROLL resumes (docs/how-to/run-roll.md, "Relocation"; the shared part is
:mod:`rollmux.adapters.common.relocation`). ROLL's step i ends with ``do_checkpoint(global_step=i)``
inside Train(i); its step i+1 opens with ``model_update``, Sync(i); then Rollout(i+1):

1. At ``do_checkpoint(i)``, with a directive pending (the train gate's shim holds it) that the job can
   honour, ROLL's own checkpoint is forced for step i (its ``save_steps`` test is met for that call,
   and ``is_last_step=True`` makes ROLL save and upload synchronously; the workers' upload threads
   are drained): ``checkpoint_config.output_dir/checkpoint-<i>``. The nodes are still the job's. An
   ``AgenticPipeline``'s rollout position (loop seeds, episode counters) goes into that checkpoint's
   ``WorkerState.kv`` (:mod:`.rollout_state`).
2. ROLL runs ``model_update``, Sync(i). At its end, once the Sync permit is released and before
   Rollout(i+1) is asked for, the driver acknowledges through the train gate.
3. Switched: the driver writes :data:`MARKER` in ``checkpoint_config.output_dir`` and stops ``run()``
   with ``JobRelocated``; the gates detach without deregistering; the driver exits 75. (ROLL puts each
   run's checkpoints in ``<output_dir>/<start time>``; the marker sits in ``<output_dir>``.)
4. Restarted on the new nodes, the job attaches as the same job: an operator-registered one with the
   same ``ROLLMUX_JOB`` / ``ROLLMUX_JOB_TOKEN``; a self-registered one (the marker says ``relayed``)
   registers again through the new node's sidecar under the name in the marker, with the same spec
   (:func:`restart_name`), and gets a fresh token, kept where any self-registered job's token is (the
   driver's memory and the gate actors'). The driver finds the marker and points
   ``resume_from_checkpoint`` at that checkpoint (``true`` would look only in the new run's own
   folder); ROLL skips steps 0..i, and its first step's ``model_update`` (the checkpointed weights
   pushed to the fresh actor_infer) runs under Rollout(i+1). An ``AgenticPipeline``'s rebuilt rollout
   schedulers get the saved position back before that Rollout (:func:`resume_rollout`).

Declined (recorded once, the directive expires, the job keeps its place): a pipeline other than
``RLVRPipeline`` and ``AgenticPipeline``, a ``checkpoint_config`` whose ``type`` is not ``file_system``,
a ``resume_from_checkpoint`` naming a fixed checkpoint, and the last step. At step 0 the job waits for
the next step's end (ROLL never checkpoints step 0).
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.common.relocation import (
    BOUNDARY_WAIT_S,
    MARKER,
    JobRelocated,
    consume_marker,
    exit_on_relocation,
    marker_for,
    marker_record,
    record,
    restart_how,
    write_marker,
)
from rollmux.adapters.common.relocation import restart_name as common_restart_name
from rollmux.adapters.roll import rollout_state


@dataclass(slots=True, kw_only=True)
class Relocator:
    """One opted-in ROLL driver's relocation state."""

    job: str
    marker: str = ""  # the marker's path ('' : this job declines every directive, see `reason`)
    ckpt: str = ""  # this run's checkpoint folder (ROLL's checkpoint_config.output_dir)
    relayed: bool = False  # registered through the sidecar: the restart registers again (written into the marker)
    reason: str = ""  # why it declines, when `marker` is ''
    run: str = field(default_factory=lambda: uuid.uuid4().hex)  # this run's id, written into the marker
    resumed: dict[str, Any] | None = None  # the marker this run resumes from, until its Rollout is granted
    declined: set[int] = field(default_factory=set)  # directive epochs this job will not honour
    pending: tuple[int, int] | None = None  # (epoch, ROLL step) checkpointed for; acknowledged at Sync's end


_STAMP = re.compile(r"^\d{8}-\d{6}$")


def _ckpt_dir(cfg: Any) -> str:
    """``checkpoint_config.output_dir`` of a ``file_system`` checkpoint config ('' for any other): this
    run's folder, which ROLL's config makes ``<output_dir as given>/<start time>``."""
    ckpt = getattr(cfg, "checkpoint_config", None) or {}
    if ckpt.get("type") != "file_system" or not ckpt.get("output_dir"):
        return ""
    return os.path.abspath(str(ckpt["output_dir"]))


def _marker_dir(cfg: Any) -> str:
    """Where the marker lives: the ``output_dir`` as the user gave it (every run of the job sees it)."""
    folder = _ckpt_dir(cfg)
    return os.path.dirname(folder) if _STAMP.match(os.path.basename(folder)) else folder


def marker_path(cfg: Any) -> str:
    """The marker's absolute path for a ROLL pipeline config ('' without a ``file_system`` checkpoint)."""
    folder = _marker_dir(cfg)
    return os.path.join(folder, MARKER) if folder else ""


def restart_name(cfg: Any) -> str | None:
    """The job name a restart of a relocated self-registered job registers under (the marker's; None
    otherwise): :func:`rollmux.adapters.common.relocation.restart_name` for this config's marker."""
    path = marker_path(cfg)
    return common_restart_name(path) if path else None


def prepare(cfg: Any, job: str, relayed: bool, tracker: Any) -> Relocator:
    """Before ROLL builds the pipeline: this run's relocator; a restart of a relocated job resumes
    from the marker's checkpoint at its next Rollout (``tracker.resume_at``) and exits 75 if moved again.

    Raises:
        AdapterError: this run restarts a relocated job but ``resume_from_checkpoint`` names another checkpoint.
    """
    path = marker_path(cfg)
    if not path:
        return Relocator(job=job, relayed=relayed, reason="checkpoint_config has no type file_system with an "
                         "output_dir: a restart could not find ROLL's relocation checkpoint")
    r = Relocator(job=job, marker=path, ckpt=_ckpt_dir(cfg), relayed=relayed)
    marker = marker_for(r.marker, job)
    if marker is not None:
        given, ours = getattr(cfg, "resume_from_checkpoint", False), marker["checkpoint"]
        if isinstance(given, str) and os.path.abspath(given) != ours:
            raise AdapterError(f"RollMux: job {job!r} was relocated at iteration {marker['iteration']} and must resume "
                               f"from {ours}, but resume_from_checkpoint={given}: set it to true or leave it unset")
        cfg.resume_from_checkpoint = ours  # `true` would look in this run's own (new, empty) folder
        if _agentic_config(cfg):
            rollout_state.restore_config(cfg, ours, job)  # env group seeds, before ROLL builds the env managers
        tracker.resume_at(int(marker["iteration"]), int(marker["step"]))
        r.resumed = marker
    exit_on_relocation(r.marker, r.run)  # ray.init ran (initialize.init): Ray's handler runs after this one
    return r


def check_resumed(r: Relocator, pipeline: Any) -> None:
    """After ROLL loaded its checkpoint: a relocated job must resume at the step it left.

    Raises:
        AdapterError: ROLL resumed from another step than the relocation checkpoint's.
    """
    if r.resumed is None:
        return
    step = int(getattr(getattr(pipeline, "state", None), "step", -1))
    if step != int(r.resumed["step"]) - 1:
        raise AdapterError(f"RollMux: job {r.job!r} was relocated after ROLL step {int(r.resumed['step']) - 1} but ROLL "
                           f"resumed after step {step}: restart it with the same checkpoint_config.output_dir")


def _agentic(pipeline: Any) -> bool:
    """Whether `pipeline` is an ``AgenticPipeline`` (an RLVR driver never imports that module: nor does this)."""
    module = sys.modules.get("roll.pipeline.agentic.agentic_pipeline")
    return module is not None and isinstance(pipeline, module.AgenticPipeline)


def _agentic_config(cfg: Any) -> bool:
    module = sys.modules.get("roll.pipeline.agentic.agentic_config")
    return module is not None and isinstance(cfg, module.AgenticConfig)


def resume_rollout(r: Relocator, pipeline: Any) -> None:
    """After ROLL loaded the relocation checkpoint, before the first rollout: an agentic job's rebuilt
    rollout schedulers continue where the moved run's stopped (:func:`rollout_state.restore`).

    Raises:
        AdapterError: the checkpoint lacks the saved position, or the env groups differ.
    """
    if r.resumed is None or not _agentic(pipeline):
        return
    saved = rollout_state.restore(pipeline, r.job)
    record("relocation_rollout_restored", job=r.job, step=r.resumed["step"], rollout=saved)


def resumed(r: Relocator, iteration: int) -> None:
    """The coordinator granted the resumed Rollout on the new nodes: the move is done."""
    if r.resumed is not None and iteration == int(r.resumed["iteration"]):
        record("relocation_resumed", job=r.job, iteration=iteration, step=r.resumed["step"])
        r.resumed = None
        consume_marker(r.marker)


def why_not(r: Relocator, pipeline: Any, step: int) -> str | None:
    """Why this job cannot honour a directive at the end of ROLL step `step` (None: it can)."""
    from roll.pipeline.rlvr.rlvr_pipeline import RLVRPipeline

    if not r.marker:
        return r.reason
    if not isinstance(pipeline, RLVRPipeline) and not _agentic(pipeline):
        return (f"{type(pipeline).__name__}: the adapter saves the rollout position of RLVRPipeline (ROLL's own "
                "scheduler state) and AgenticPipeline only (docs/how-to/run-roll.md, Relocation)")
    cfg = pipeline.pipeline_config
    given = getattr(cfg, "resume_from_checkpoint", False)
    if isinstance(given, str) and os.path.abspath(given) != os.path.abspath(_checkpoint(cfg, step)):
        return f"resume_from_checkpoint={given}: a restart would not resume from the relocation checkpoint"
    if step >= int(cfg.max_steps) - 1:
        return "the last step: the job ends here"
    return None


def _checkpoint(cfg: Any, step: int) -> str:
    return os.path.join(_ckpt_dir(cfg), f"checkpoint-{step}")


def at_checkpoint(r: Relocator, gates: Any, wrapped: Any, pipeline: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """``do_checkpoint(global_step)`` at the end of a step (inside its Train permit): with a directive
    pending that the job can honour, force ROLL's checkpoint of this step and remember to acknowledge."""
    step = int(kwargs.get("global_step", args[0] if args else -1))
    d = gates.relocation() if step >= 1 else None  # ROLL never checkpoints step 0: wait for the next step
    if d is None or d.epoch in r.declined:
        return wrapped(*args, **kwargs)
    reason = why_not(r, pipeline, step)
    if reason is not None:
        r.declined.add(d.epoch)
        record("relocation_declined", job=r.job, epoch=d.epoch, step=step, reason=reason)
        return wrapped(*args, **kwargs)
    cfg, t0 = pipeline.pipeline_config, time.perf_counter()
    saved, agentic = cfg.save_steps, _agentic(pipeline)
    cfg.save_steps = step  # ROLL saves when global_step % save_steps == 0
    try:
        rollout = rollout_state.save(pipeline) if agentic else None  # into state.kv, which ROLL writes now
        result = wrapped(global_step=step, is_last_step=True)  # last: ROLL saves and uploads synchronously
    finally:
        cfg.save_steps = saved
        if agentic:
            rollout_state.forget(pipeline)
    _drain_uploads(pipeline)
    r.pending = (d.epoch, step)
    record("relocation_checkpoint", job=r.job, epoch=d.epoch, step=step, checkpoint=_checkpoint(cfg, step),
           seconds=round(time.perf_counter() - t0, 6), **({"rollout": rollout} if agentic else {}))
    return result


def _drain(worker: Any) -> None:
    """Runs in a ROLL worker: wait for its strategy's checkpoint uploads (a fresh pool takes new ones)."""
    from concurrent import futures

    strategy = getattr(worker, "strategy", None)
    pool = getattr(strategy, "thread_executor", None)
    if pool is not None:
        strategy.thread_executor = futures.ThreadPoolExecutor(max_workers=pool._max_workers)  # noqa: SLF001
        pool.shutdown(wait=True)


def _drain_uploads(pipeline: Any) -> None:
    import ray

    workers = [w for c in getattr(pipeline, "checkpoint_clusters", None) or [] for w in getattr(c, "workers", [])]
    ray.get([w.__ray_call__.remote(_drain) for w in workers])


def at_boundary(r: Relocator, gates: Any, iteration: int) -> None:
    """Sync released, Rollout(`iteration`) not asked for: acknowledge the directive checkpointed for.

    Raises:
        JobRelocated: the coordinator switched the job; ``run()`` stops (the driver exits 75).
    """
    (epoch, step), r.pending = r.pending, None
    switched, state = gates.relocate(BOUNDARY_WAIT_S)
    if switched is None:  # cancelled, expired, or not at a boundary for the coordinator yet: the job stays
        record("relocation_kept", job=r.job, epoch=epoch, iteration=iteration, state=state)
        return
    ckpt = r.ckpt
    write_marker(r.marker, marker_record(r.job, switched, iteration=iteration, step=step + 1, run=r.run,
                                         checkpoint=os.path.join(ckpt, f"checkpoint-{step}"), relayed=r.relayed))
    record("relocation_exit", job=r.job, epoch=epoch, iteration=iteration, train_nodes=list(switched.train_nodes),
           rollout_nodes=list(switched.rollout_nodes))
    raise JobRelocated(f"RollMux relocated job {r.job!r} to {switched.to_group} (nodes {list(switched.rollout_nodes)} / "
                       f"{list(switched.train_nodes)}): ROLL's checkpoint of step {step} is in {ckpt}; restart the "
                       f"job there ({restart_how(r.relayed)}) with the same checkpoint_config (exit 75)")
