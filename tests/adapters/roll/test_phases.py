"""The span -> phase tracker: ROLL's loops become the coordinator's on-policy phase order."""

from __future__ import annotations

import pytest

from rollmux.adapters.roll.phases import Action, PhaseTracker, Step


def _run(tracker: PhaseTracker, events: list[tuple[str, str]], first_step: int = 0) -> list[tuple[str, str, int]]:
    out: list[Step] = []
    step = first_step
    for kind, span in events:
        if kind == "begin" and span == "pipeline_step":
            out += tracker.begin(span, step)
            step += 1
        elif kind == "begin":
            out += tracker.begin(span)
        else:
            out += tracker.end(span)
    out += tracker.finish()
    return [(s.action.value, s.phase, s.iteration) for s in out]


RLVR_STEP = [("begin", "pipeline_step"), ("begin", "stop_server"), ("end", "stop_server"),
             ("begin", "model_update"), ("end", "model_update"), ("begin", "generate"), ("end", "generate"),
             ("begin", "ref_log_probs"), ("end", "ref_log_probs"), ("begin", "old_log_probs_and_values"),
             ("end", "old_log_probs_and_values"), ("begin", "compute_advantage"), ("end", "compute_advantage"),
             ("begin", "train"), ("end", "train"), ("end", "pipeline_step")]


def test_rlvr_steps_follow_rollout_train_sync_with_the_first_push_ungated() -> None:
    got = _run(PhaseTracker(), RLVR_STEP * 3)
    assert got == [("open", "rollout", 0), ("close", "rollout", 0), ("open", "train", 0), ("close", "train", 0),
                   ("open", "sync", 0), ("close", "sync", 0), ("open", "rollout", 1), ("close", "rollout", 1),
                   ("open", "train", 1), ("close", "train", 1), ("open", "sync", 1), ("close", "sync", 1),
                   ("open", "rollout", 2), ("close", "rollout", 2), ("open", "train", 2), ("close", "train", 2)]


def test_agentic_span_names_map_to_the_same_phases_and_a_resumed_run_counts_from_zero() -> None:
    step = [("begin", "pipeline_step"), ("begin", "model_update"), ("end", "model_update"), ("begin", "rollout"),
            ("end", "rollout"), ("begin", "cal_ref_log_probs"), ("end", "cal_ref_log_probs"),
            ("begin", "cal_old_log_probs_values"), ("end", "cal_old_log_probs_values"), ("begin", "train"),
            ("end", "train"), ("begin", "log"), ("end", "log"), ("end", "pipeline_step")]
    assert _run(PhaseTracker(), step * 2, first_step=7) == _run(PhaseTracker(), RLVR_STEP * 2)


def test_agentic_rollout_permit_is_held_past_its_span_until_actor_infer_is_offloaded() -> None:
    t = PhaseTracker()
    t.begin("pipeline_step", 0)
    t.begin("model_update")
    t.end("model_update")
    t.begin("rollout")
    assert t.end("rollout") == []  # AgenticPipeline offloads actor_infer after this span
    assert t.open_phase == ("rollout", 0)
    assert t.begin("cal_ref_log_probs") == [Step(action=Action.CLOSE, phase="rollout", iteration=0),
                                            Step(action=Action.OPEN, phase="train", iteration=0)]


def test_a_step_without_train_still_passes_train_in_order() -> None:
    skipped = [e for e in RLVR_STEP if e[1] not in ("ref_log_probs", "old_log_probs_and_values", "train")]
    got = _run(PhaseTracker(), RLVR_STEP + skipped + RLVR_STEP)
    assert got[4:12] == [("open", "sync", 0), ("close", "sync", 0), ("open", "rollout", 1), ("close", "rollout", 1),
                         ("open", "train", 1), ("close", "train", 1), ("open", "sync", 1), ("close", "sync", 1)]


def test_a_failure_mid_phase_releases_the_held_permit() -> None:
    t = PhaseTracker()
    t.begin("pipeline_step", 0)
    t.begin("model_update")
    assert t.end("model_update") == [Step(action=Action.OPEN, phase="rollout", iteration=0)]
    assert t.begin("generate") == []  # already held since model_update ended (actor_infer loads under it)
    assert t.open_phase == ("rollout", 0)
    assert t.finish() == [Step(action=Action.CLOSE, phase="rollout", iteration=0)]
    assert t.finish() == []


def test_unknown_spans_do_not_move_the_phase_and_steps_validate() -> None:
    t = PhaseTracker()
    assert t.begin("validation") == [] and t.end("val") == []
    with pytest.raises(ValueError, match="phase='eval'"):
        Step(action=Action.OPEN, phase="eval", iteration=0)


def test_steps_on_one_gate_go_in_one_call_per_run_of_that_gate() -> None:
    from rollmux.adapters.roll.gate import by_gate

    t = PhaseTracker()
    t.begin("pipeline_step", 0)
    t.end("model_update")
    t.end("generate")
    t.begin("pipeline_step", 1)
    switch = t.begin("model_update")  # train(0) skipped: open + close it, then open sync(0)
    assert [(pool, len(batch)) for pool, batch in by_gate(switch, "colocated-train")] == [("train", 3)]
    back = t.end("model_update")  # close sync(0), open rollout(1): two gates when disaggregated
    assert [(pool, len(batch)) for pool, batch in by_gate(back, "disaggregated")] == [("train", 1), ("rollout", 1)]
    assert [s for _, batch in by_gate(switch + back, "disaggregated") for s in batch] == switch + back


def test_a_gate_call_ends_at_an_open_so_the_ranks_enter_each_phase_the_gate_holds() -> None:
    """The ranks enter a phase after the gate holds it: an empty phase (open, close) and the next open
    go as two calls, so the ranks pass through the empty phase too."""
    from rollmux.adapters.roll.gate import through_opens

    t = PhaseTracker()
    t.begin("pipeline_step", 0)
    t.end("model_update")
    t.end("generate")
    t.begin("pipeline_step", 1)
    switch = t.begin("model_update")  # open + close the skipped train(0), open sync(0)
    back = t.end("model_update")  # close sync(0), open rollout(1)
    parts = [[(s.action.value, s.phase, s.iteration) for s in part] for part in through_opens(switch + back)]
    assert parts == [[("open", "train", 0)], [("close", "train", 0), ("open", "sync", 0)],
                     [("close", "sync", 0), ("open", "rollout", 1)]]
    assert through_opens(t.finish()) == [[Step(action=Action.CLOSE, phase="rollout", iteration=1)]]
    assert through_opens([]) == []
