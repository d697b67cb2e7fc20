"""End to end, as real processes: embedded coordinator, a sidecar per pool, two tiny GRPO jobs gated
through the shim for a few iterations. Checks the phase records: no two phases ever overlapped on a
node, each job ran its phases in on-policy order, and both jobs finished and were deregistered."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rollmux.demo.launch import JobKnobs, LocalCluster, read_jsonl
from rollmux.demo.report import order_violations, overlaps, spans

ITERATIONS = 3
JOBS = (
    JobKnobs(name="roll-heavy", iterations=ITERATIONS, seed=1,
             flags=("--max-new-tokens", "10", "--prompts", "4", "--group-size", "4")),
    JobKnobs(name="train-heavy", iterations=ITERATIONS, seed=2,
             flags=("--max-new-tokens", "4", "--prompts", "4", "--group-size", "4", "--train-epochs", "3")),
)


@pytest.mark.timeout(240)
def test_two_jobs_multiplexed_end_to_end(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, fill_saturated=True) as cluster:
        running = [cluster.launch(k, cluster.register(k, t_roll_s=0.1, t_train_s=0.1, slo=3.0)) for k in JOBS]
        deadline = time.monotonic() + 180
        while any(j.poll() is None for j in running):
            assert time.monotonic() < deadline, "jobs did not finish in time"
            time.sleep(0.2)
        codes = {j.knobs.name: j.poll() for j in running}
        assert codes == {k.name: 0 for k in JOBS}, f"exit codes {codes}; logs in {tmp_path}"
        deadline = time.monotonic() + 30
        while cluster.client.cluster_state().jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not cluster.client.cluster_state().jobs, "finished jobs were not deregistered"

    sp = spans(read_jsonl(tmp_path / "phases.jsonl"))
    assert not overlaps(sp), overlaps(sp)
    assert not order_violations(sp), order_violations(sp)
    for k in JOBS:
        owned = [(s.phase, s.iteration) for s in sp if s.job == k.name]
        expected = [(p, i) for i in range(ITERATIONS) for p in ("rollout", "train", "sync")][:-1]  # no last sync
        assert owned == expected, owned
        assert len(read_jsonl(tmp_path / f"{k.name}.jsonl")) == ITERATIONS
    # both jobs were on the same two nodes, interleaved
    assert {s.node for s in sp} == {"rollout-0", "train-0"}
