"""A disaggregated real ROLL RLVR job (actor_train on fake GPU 0, actor_infer on fake GPU 1), opted in:
its weights move through ``rollmux.sync_plugin`` (``adapters/roll/weight_sync.py``), not ROLL's
one-source broadcast, and arrive bit for bit through ROLL's own bucket loader.

Unset, the same job cannot run on this CPU stand-in: ROLL's separated path calls
``setup_collective_group`` with a signature hf_infer's strategy does not take (see
shared/reference/roll_cpu_harness.md, section 6); with vLLM on GPUs it is ROLL's NCCL broadcast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .testbed import Pools, build_assets, launch, phase_records, roll_unavailable

_reason = roll_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(_reason is not None, reason=str(_reason))]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    wd: Path = tmp_path_factory.mktemp("roll-sync")
    build_assets(wd)
    pools = Pools(wd).start()
    try:
        job = launch("dis-a", wd, disaggregated=True, check_weights=True,
                     extra_env={**pools.job_env(wd / "events.jsonl"), "ROLLMUX_JOB": "dis-a"})
        return {**job.wait(timeout_s=600), "records": phase_records(wd / "events.jsonl")}
    finally:
        pools.stop()


def test_every_step_syncs_through_the_plugin(run: dict[str, Any]) -> None:
    assert run["rc"] == 0, run["log_tail"]
    assert len(run["steps"]) == 2
    param_bytes = {s["rollmux_sync/sent_bytes"] for s in run["steps"]}
    assert len(param_bytes) == 1 and param_bytes.pop() > 0, run["steps"]  # the whole model, every step
    assert all(s["rollmux_sync/windows"] >= 1 for s in run["steps"])


def test_the_inference_worker_gets_the_trained_weights_bit_for_bit(run: dict[str, Any]) -> None:
    assert run["rc"] == 0, run["log_tail"]
    w = run["weights"]
    assert len(w["train"]) > 10
    assert all(before != w["train"] for before in w["infer_before"])  # the harness nudged actor_train's weights
    assert w["infer"] == [w["train"]] * len(w["infer"])


def test_a_disaggregated_job_rolls_out_on_the_rollout_pool(run: dict[str, Any]) -> None:
    """actor_infer and actor_train on disjoint GPUs: the job registers disaggregated, so its Rollout
    permit is held on the rollout node and Train and Sync on the training node."""
    assert run["rc"] == 0, run["log_tail"]
    nodes = {(r["phase"], r["node"]) for r in run["records"]}
    assert nodes == {("rollout", "r0"), ("train", "t0"), ("sync", "t0")}, nodes
