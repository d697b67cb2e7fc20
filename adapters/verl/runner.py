"""The trainer-loop side: the job's phase tracker in the process that runs veRL's trainer (the
TaskRunner actor), its permit gates, offload between phases and rollout progress.

Created lazily at the first phase boundary the trainer crosses (``CheckpointEngineManager`` and the
trainer methods are only called in that process), it attaches this process to the node sidecar as
rank 0 of the job, from the variables the driver put into the job's runtime environment and the
token it published in the job's Ray instance. Every phase is also entered by each of the job's GPU
processes on its own node (``rollmux.adapters.common.ranks``: the phase starts once every node's
permit was granted to the ranks there, and ends once they all released). The
rollout phase of a disaggregated job is gated on the rollout pool's sidecar through a second rank
when ``ROLLMUX_ROLLOUT_SIDECAR_SOCKET`` names one; a co-located job (veRL's hybrid engine) asks for
every permit, Rollout included, on its training node (``ROLLMUX_DEPLOYMENT``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollmux.adapters.common import PhaseTracker
from rollmux.adapters.common import env as adapter_env
from rollmux.adapters.common.phases import PhaseRecord
from rollmux.adapters.common.ranks import RanksGate
from rollmux.adapters.common.registration import job_token, opted_in
from rollmux.adapters.common.relocation import record  # also `runner.record` for the plugin and targets
from rollmux.adapters.verl import offload, relocation
from rollmux.shim import env
from rollmux.shim.pools import phase_pool

log = logging.getLogger(__name__)


def _nodes(held: Any) -> tuple[str, ...]:
    lease = getattr(held, "lease", None)
    return tuple(lease.nodes) if lease is not None else ()


class ShimGate:
    """This process's own rank: ``rollmux.phase`` entered and left explicitly."""

    def __init__(self) -> None:
        self.held: Any = None  # the shim's PhaseContext of the phase entered last (None once left)

    def enter(self, phase: str, iteration: int) -> Any:
        from rollmux.shim import api as shim

        ctx = shim.phase(phase, iteration=iteration)
        self.held = ctx.__enter__()
        return ctx

    def exit(self, handle: Any) -> None:
        self.held = None
        handle.__exit__(None, None, None)

    def nodes(self) -> tuple[str, ...]:
        """The nodes the held permit covers (empty when none is held)."""
        return _nodes(self.held)


class RankGate:
    """A second rank of the job on another sidecar (``shim.attach_rank``)."""

    def __init__(self, rank: Any) -> None:
        self.rank = rank
        self.held: Any = None

    def enter(self, phase: str, iteration: int) -> Any:
        self.held = self.rank.enter(phase, iteration)
        return self.held

    def exit(self, handle: Any) -> None:
        self.held = None
        self.rank.exit(handle)

    def nodes(self) -> tuple[str, ...]:
        return _nodes(self.held)


@dataclass(slots=True)
class Runner:
    """The opted-in trainer loop of one job (one per process)."""

    job: str
    tracker: PhaseTracker
    own: ShimGate
    own_gate: RanksGate | None = None  # own rank + the job's ranks on their nodes (set by _start)
    rollout_rank: Any = None  # shim.RankHandle on the rollout pool's sidecar, or None
    rollout_gate: RanksGate | RankGate | None = None  # the gate over rollout_rank (made at its first use)
    trainer: Any = None  # the veRL trainer, seen at its first train boundary
    offload_s: list[float] = field(default_factory=list)  # measured worker `to("cpu")` times
    reload_s: list[float] = field(default_factory=list)  # measured worker `to("device")` times
    report: Callable[[int, int], Any] | None = None  # progress sink; None: rollmux.runtime_hook
    withheld: int = -1  # the last rollout iteration whose progress was withheld (recorded once each)
    declined: set[int] = field(default_factory=set)  # relocation directive epochs this job will not honour
    relocating: int | None = None  # the directive epoch checkpointed for at the last Sync (acknowledged next)
    resumed: int | None = None  # restarted after a relocation: the iteration it resumes at (relocation.py)
    pending_push: Any = None  # offload.DeferredPush: Sync's weight push, run at the next Rollout (memory.py)
    finished: bool = False

    def gate_for(self, phase: str) -> RanksGate | RankGate | ShimGate:
        """The phase's gate: this process's own rank on the phase's pool, with every GPU process of the
        job entering the phase on its own node (``rollmux.adapters.common.ranks``)."""
        if phase == "rollout" and self.rollout_rank is not None:
            if self.rollout_gate is None:  # one gate, so that the permit it holds can be looked at
                ranks, gate = self.own_gate, RankGate(self.rollout_rank)
                self.rollout_gate = gate if ranks is None else RanksGate(
                    job=self.job, inner=gate, timeout_s=ranks.timeout_s, board=ranks.board)
            return self.rollout_gate
        return self.own_gate if self.own_gate is not None else self.own

    def progress(self, finished: int, total: int) -> None:
        """Report the open rollout's progress (``finished`` of ``total`` responses) to the coordinator.

        Only while the rollout permit covers one node. The coordinator migrates a rollout that holds two
        or more nodes and frees the released ones as it answers (``report_progress``); this adapter cannot
        move veRL's requests off them (docs/how-to/run-verl.md, "Long-tail migration"), so another job would be
        granted nodes whose replicas still generate. Such a rollout's progress is withheld (recorded
        once per rollout as ``progress_withheld``) and its nodes come free at the rollout's end.
        """
        if self.finished or self.tracker.current != "rollout":
            return
        nodes = self.gate_for("rollout").nodes()
        if len(nodes) > 1:
            if self.withheld != self.tracker.iteration:
                self.withheld = self.tracker.iteration
                record("progress_withheld", job=self.job, iteration=self.withheld, nodes=list(nodes))
            return
        if self.report is None:
            from rollmux.shim import api as shim

            self.report = shim.runtime_hook
        directive = self.report(finished, total)
        if directive is not None:  # not sent to a one-node rollout; should one come, the tail stays put
            record("migration_ignored", job=directive.job, keep=list(directive.keep_nodes))

    # ------------------------------------------------------------------------- phase callbacks
    def before_begin(self, phase: str, iteration: int) -> None:
        if phase == "rollout" and self.relocating is not None:
            relocation.at_rollout_begin(self)  # the iteration boundary: may stop the trainer (JobRelocated)

    def on_enter(self, phase: str, iteration: int) -> None:
        if phase == "train":
            self._move("device", self.reload_s)
        elif self.resumed is not None:  # the coordinator granted the resumed Rollout: the move is done
            path = os.environ.get(relocation.MARKER_ENV, "")
            record("relocation_resumed", job=self.job, iteration=iteration, node=list(self.gate_for(phase).nodes()))
            self.resumed = None
            if path and os.path.exists(path):
                os.remove(path)
        if phase == "rollout":
            offload.run_deferred_push(self)  # the engine wakes inside the Rollout's permit

    def check_resumed(self, trainer: Any) -> None:
        """After veRL loaded its checkpoint: a relocated job must resume at the step it left.

        Raises:
            AdapterError: veRL resumed from another step than the relocation checkpoint's.
        """
        steps = int(getattr(trainer, "global_steps", 0) or 0)
        if self.resumed is not None and steps != self.resumed:
            from rollmux.adapters.common import AdapterError

            raise AdapterError(f"RollMux: job {self.job!r} was relocated after step {self.resumed} but veRL resumed "
                               f"from step {steps}: restart it with trainer.resume_mode=auto and the same "
                               "trainer.default_local_dir (its relocation checkpoint)")

    def on_exit(self, phase: str, iteration: int) -> None:
        if phase == "sync":
            self._move("cpu", self.offload_s)  # trainer state leaves the GPU until the next train phase

    def on_closed(self, rec: PhaseRecord) -> None:
        record("boundary", job=self.job, phase=rec.phase, iteration=rec.iteration,
               acquire_s=round(rec.acquire_s, 6), release_s=round(rec.release_s, 6))

    def moves_state(self) -> bool:
        """True when this runner offloads the trainer state between phases (veRL does not do it itself)."""
        wg = getattr(self.trainer, "actor_rollout_wg", None)
        return wg is not None and hasattr(wg, "to") and not _engine_offloads(self.trainer)

    def _move(self, device: str, times: list[float]) -> None:
        if not self.moves_state():
            return
        t0 = time.perf_counter()
        self.trainer.actor_rollout_wg.to(device, model=True, optimizer=True, grad=True)
        times.append(time.perf_counter() - t0)
        record("offload" if device == "cpu" else "reload", job=self.job, seconds=round(times[-1], 6))

    def finish(self) -> None:
        """End the open phase and deregister the job (clean exit). Idempotent."""
        if self.finished:
            return
        self.finished = True
        from rollmux.shim import api as shim

        try:
            self.tracker.end()
        finally:
            if self.own_gate is not None:
                self.own_gate.detach()  # the job's ranks leave their sidecars before the job deregisters
            if self.rollout_rank is not None:
                self.rollout_rank.close()
            shim.shutdown(job_done=True)
            record("finished", job=self.job, phases=len(self.tracker.history))


def _engine_offloads(trainer: Any) -> bool:
    """True when veRL already offloads the actor between its own calls (param + optimizer offload)."""
    cfg = getattr(trainer, "config", None)
    try:
        fsdp = cfg.actor_rollout_ref.actor.fsdp_config  # type: ignore[union-attr]
        return bool(fsdp.param_offload) and bool(fsdp.optimizer_offload)
    except AttributeError:
        return False


_runner: Runner | None = None
_lock = threading.Lock()


def runner() -> Runner | None:
    """This process's runner, created at the first call when opted in (None otherwise)."""
    global _runner
    if _runner is not None or not opted_in():
        return _runner
    with _lock:
        if _runner is None:
            _runner = _start()
    return _runner


def tracker() -> PhaseTracker | None:
    r = runner()
    return None if r is None or r.finished else r.tracker


def _start() -> Runner:
    from rollmux.shim import api as shim

    job = os.environ.get(env.JOB, "")
    token = job_token(job)  # published by the driver in this Ray instance's memory
    shim.init(job=job, job_token=token)  # rank 0 on this node's sidecar (ROLLMUX_SIDECAR_SOCKET)
    rollout_socket = os.environ.get(adapter_env.ROLLOUT_SIDECAR_SOCKET, "")
    rank = None
    disaggregated = phase_pool("rollout", os.environ.get(env.DEPLOYMENT)) == "rollout"
    if disaggregated and rollout_socket and rollout_socket != os.environ.get(env.SIDECAR_SOCKET):
        rank = shim.attach_rank(socket=rollout_socket, job=job, job_token=token, rank=1,
                                event_log=os.environ.get(env.EVENT_LOG) or None)
    own = ShimGate()
    r = Runner(job=job, tracker=PhaseTracker(gate_for=lambda phase: own), own=own, rollout_rank=rank)
    r.own_gate = RanksGate(job=job, inner=own, timeout_s=float(os.environ.get(env.PERMIT_TIMEOUT_S) or 600.0))
    r.tracker.gate_for = r.gate_for
    r.tracker.on_enter, r.tracker.on_exit, r.tracker.on_closed = r.on_enter, r.on_exit, r.on_closed
    r.tracker.before_begin = r.before_begin
    resume = os.environ.get(relocation.RESUME_ENV, "")
    if resume:  # restarted on its new nodes after a relocation: the coordinator expects Rollout(resume)
        r.resumed = int(resume)
        r.tracker.resume_at(r.resumed)
    record("attached", job=job, rollout_rank=rank is not None, resume_at=r.resumed)
    return r

