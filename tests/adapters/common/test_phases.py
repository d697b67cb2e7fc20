"""The phase tracker and its boundary wrappers: on-policy order, one phase open at a time, sync and
coroutine targets, and a refusal for an out-of-order boundary."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollmux.adapters.common import AdapterError, PhaseTracker, begins, ends, spans


class RecordingGate:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []

    def enter(self, phase: str, iteration: int) -> Any:
        self.log.append(("enter", phase, iteration))
        return (phase, iteration)

    def exit(self, handle: Any) -> None:
        self.log.append(("exit", *handle))


def test_boundaries_open_and_close_phases_in_on_policy_order() -> None:
    gate = RecordingGate()
    tracker = PhaseTracker(gate_for=lambda phase: gate)
    submit = begins(lambda: tracker, "rollout")
    sleep = ends(lambda: tracker, "rollout")
    train = begins(lambda: tracker, "train")
    sync = spans(lambda: tracker, "sync")

    async def update_weights(step: int) -> int:
        await asyncio.sleep(0)
        return step

    for step in range(2):
        submit(lambda: None, None, (), {})
        submit(lambda: None, None, (), {})  # still the same rollout
        sleep(lambda: None, None, (), {})
        train(lambda: None, None, (), {})
        train(lambda: None, None, (), {})
        assert asyncio.run(sync(update_weights, None, (step,), {})) == step  # coroutine target
    assert gate.log == [(e, p, i) for i in range(2) for p in ("rollout", "train", "sync") for e in ("enter", "exit")]
    assert [(r.phase, r.iteration) for r in tracker.history] == [(p, i) for i in range(2)
                                                                 for p in ("rollout", "train", "sync")]
    assert tracker.current is None and tracker.iteration == 2


def test_out_of_order_boundary_is_refused_and_ends_of_other_phase_is_noop() -> None:
    tracker = PhaseTracker(gate_for=lambda phase: RecordingGate())
    ends(lambda: tracker, "rollout")(lambda: 1, None, (), {})  # nothing open: no-op
    with pytest.raises(AdapterError, match=r"entered 'train' but the job's next phase is rollout\(0\)"):
        begins(lambda: tracker, "train")(lambda: 1, None, (), {})


def test_no_tracker_in_this_process_calls_straight_through() -> None:
    assert spans(lambda: None, "sync")(lambda x: x * 2, None, (3,), {}) == 6
