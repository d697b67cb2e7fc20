"""The harness's start gate comes before a trainer's first permit, in a fresh interpreter against the real
veRL 0.9.1 v1 sync trainer: its ``init()`` ends with the initial weight push (``on_init_end``, which the
adapter gates as Rollout(0)), so the gate waits right before that push. A job waiting at the gate while
it held its node kept the other jobs of the node from ever reaching the gate (the multiplex module
stalled for good). The trainer's own set-up and the checkpoint manager (servers, workers) are stand-ins:
only the order of gate and push is under test."""

from __future__ import annotations

import json
from pathlib import Path

from tests.adapters.conftest import run_fresh

HARNESS = Path(__file__).parent / "harness"


def test_the_v1_trainer_waits_at_the_gate_before_its_initial_weight_push(tmp_path: Path) -> None:
    go, events = tmp_path / "go", tmp_path / "harness.jsonl"
    res = run_fresh(f'''
import json, os, threading, time
import verl.trainer.ppo.v1.trainer_sync as ts

calls = []

class Push:  # the checkpoint manager's one call in on_init_end (stand-in: no servers to push to)
    def update_weights(self, steps):
        calls.append(["push", time.time(), os.path.exists({str(go)!r})])

trainer = ts.PPOTrainerSync.__new__(ts.PPOTrainerSync)
trainer._setup = lambda: calls.append(["setup", time.time(), os.path.exists({str(go)!r})])
trainer.checkpoint_manager, trainer.global_steps = Push(), 0
opened = threading.Timer(0.5, lambda: open({str(go)!r}, "w").close())
opened.start()
trainer.init()
assert "on_init_end" not in vars(trainer)  # the gate leaves the trainer as it found it
print(json.dumps(calls))
''', path=HARNESS, env={"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "rollmux_verl_cpu",
                        "RMX_START_FILE": str(go), "RMX_HARNESS_EVENTS": str(events)}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    calls = json.loads(res.stdout.strip().splitlines()[-1])
    assert [c[0] for c in calls] == ["setup", "push"], calls
    assert calls[1][2], "the initial weight push (Rollout(0)) ran before the start gate opened"
    gate = [json.loads(line) for line in events.read_text().splitlines() if '"start_gate"' in line]
    assert [g["trainer"] for g in gate] == ["PPOTrainer"]
    assert calls[0][1] <= gate[0]["t"] <= calls[1][1]  # after the workers were built, before the push
