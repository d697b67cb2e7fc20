"""Map the tracing spans of ROLL's pipeline loops onto RollMux's on-policy phases (pure, no I/O).

``RLVRPipeline.run`` and ``AgenticPipeline.run`` open one span per phase of a step (ROLL commit
8eb27cc2)::

    pipeline_step(global_step) > model_update > [validation] > generate | rollout
                               > ref_log_probs | cal_ref_log_probs
                               > old_log_probs_and_values | cal_old_log_probs_values > ... > train

The coordinator's order per job is Rollout(i) -> Train(i) -> Sync(i). ROLL's step i pushes the
weights trained in step i-1 first, so its ``model_update`` is Sync(i-1), and the first step's push
(the initial weights, identical on both sides) runs ungated. Which phase holds which pool's nodes:

* Sync(i-1) spans ``model_update``;
* Rollout(i) starts when ``model_update`` ends, so ``actor_infer.load_states`` (and validation) run
  under it, and ends once actor_infer is offloaded: with the ``generate`` span (RLVR, which offloads
  inside it), or when the first train span opens (Agentic offloads after its ``rollout`` span);
* Train(i) starts with the first log-prob span and stays open through ``train``, the checkpoint and
  the next step's ``actor_train.offload_states``, until the next ``model_update`` (Sync(i)).

A step that skips a phase (ROLL skips ``train`` when every response is masked) still has to pass
through it in the coordinator's order, so the tracker emits it as an empty phase.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rollmux.core.model import PHASE_ORDER, next_phase, phase_key

SPAN_PHASES: dict[str, str] = {
    "model_update": "sync",
    "generate": "rollout",  # RLVRPipeline
    "rollout": "rollout",  # AgenticPipeline
    "ref_log_probs": "train",
    "old_log_probs_and_values": "train",
    "train": "train",
    "cal_ref_log_probs": "train",  # AgenticPipeline
    "cal_old_log_probs_values": "train",  # AgenticPipeline
}
"""Span name -> the RollMux phase it belongs to. Other spans do not move the phase."""

ROLLOUT_CLOSING_SPANS = frozenset({"generate"})
"""Spans whose end releases the rollout permit. ``RLVRPipeline``'s ``generate`` offloads actor_infer
inside the span; ``AgenticPipeline`` offloads it after its ``rollout`` span, so there the rollout
permit is held until the first train span opens."""

STEP_SPAN = "pipeline_step"
"""The span around one whole step; its ``global_step`` attribute numbers the step."""

class Action(str, enum.Enum):
    OPEN = "open"  # acquire the permit for (phase, iteration) and hold it
    CLOSE = "close"  # release the permit held for (phase, iteration)


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One thing the gate must do, in order."""

    action: Action
    phase: str
    iteration: int

    def __post_init__(self) -> None:
        if self.phase not in PHASE_ORDER:
            raise ValueError(f"phase={self.phase!r}: expected one of {', '.join(PHASE_ORDER)}")
        if self.iteration < 0:
            raise ValueError(f"iteration={self.iteration}: expected >= 0")


class PhaseTracker:
    """Turns span begin/end events of one pipeline run into permit open/close steps.

    Iterations count from the first step this run executes (a resumed run starts again at 0, as
    the job registers afresh).
    """

    def __init__(self) -> None:
        self._first: int | None = None
        self._step = 0
        self._open: tuple[str, int] | None = None
        self._next: tuple[str, int] = ("rollout", 0)  # the next phase the coordinator expects
        self._resume: int | None = None  # a relocated job's restart: the iteration it resumes at

    def resume_at(self, iteration: int, step: int) -> None:
        """Start at Rollout(`iteration`), ROLL's step `step`: a relocated job restarted from its checkpoint
        as the same registered job (the coordinator kept its next phase). Its first ``model_update`` pushes
        the checkpointed weights to the fresh actor_infer: it runs under Rollout(`iteration`).

        Raises:
            ValueError: a step already began, or `iteration` > `step` or is negative.
        """
        if self._first is not None or self._open is not None or not 0 <= iteration <= step:
            raise ValueError(f"cannot resume at Rollout({iteration}) (ROLL step {step}) once a step began")
        self._first, self._resume, self._next = step - iteration, iteration, ("rollout", iteration)

    @property
    def open_phase(self) -> tuple[str, int] | None:
        """The (phase, iteration) whose permit is held, if any."""
        return self._open

    def begin(self, span: str, global_step: int | None = None) -> list[Step]:
        """A span opened. `global_step` is the ``pipeline_step`` span's attribute."""
        if span == STEP_SPAN:
            step = self._step + 1 if global_step is None else int(global_step)
            self._first = step if self._first is None else self._first
            self._step = step
            return []
        phase = SPAN_PHASES.get(span)
        it = self._step - (self._first or 0)
        if phase == "sync" and it == self._resume:
            return self._close() + self._goto("rollout", it)  # the resumed push
        if phase == "sync":
            return self._close() + ([] if it == 0 else self._goto("sync", it - 1))
        if phase is None or self._open == (phase, it):
            return []
        return self._close() + self._goto(phase, it)

    def end(self, span: str) -> list[Step]:
        """A span closed."""
        phase = SPAN_PHASES.get(span)
        it = self._step - (self._first or 0)
        if phase == "sync" and self._open == ("rollout", it):
            return []  # the resumed push ran inside Rollout(it), which goes on
        if phase == "sync":  # the rollout's first work (loading actor_infer) follows at once
            return self._close() + self._goto("rollout", it)
        if span in ROLLOUT_CLOSING_SPANS:
            return self._close()
        return []

    def finish(self) -> list[Step]:
        """The run ended (or failed): release whatever is held."""
        return self._close()

    def _close(self) -> list[Step]:
        if self._open is None:
            return []
        phase, it = self._open
        self._open = None
        return [Step(action=Action.CLOSE, phase=phase, iteration=it)]

    def _goto(self, phase: str, it: int) -> list[Step]:
        """Open (phase, it), passing empty phases for any the step skipped in the on-policy order."""
        steps: list[Step] = []
        while self._next != (phase, it):
            nphase, nit = self._next
            if phase_key(nphase, nit) > phase_key(phase, it):
                raise ValueError(f"phase {phase}({it}) is behind the job's on-policy order (next is "
                                 f"{nphase}({nit})): ROLL ran a phase twice in one step")
            steps += [Step(action=Action.OPEN, phase=nphase, iteration=nit),
                      Step(action=Action.CLOSE, phase=nphase, iteration=nit)]
            self._next = _successor(nphase, nit)
        self._open = (phase, it)
        self._next = _successor(phase, it)
        return steps + [Step(action=Action.OPEN, phase=phase, iteration=it)]


def _successor(phase: str, it: int) -> tuple[str, int]:
    nxt, nit = next_phase(phase, it)
    return nxt.value, nit
