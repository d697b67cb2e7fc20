"""A disaggregated real ROLL RLVR job (actor_train on fake GPU 0, actor_infer on fake GPU 1), opted in:
its weights move through ``rollmux.sync_plugin`` (``adapters/roll/weight_sync.py``), not ROLL's
one-source broadcast, and arrive bit for bit through ROLL's own bucket loader, under the job's Rollout
permit: received during Sync (which holds the training node only), they wait in host memory until
actor_infer's ``load_states``, and actor_infer loads and offloads its states only inside its Rollout
permits on the rollout node (in between, its memory is released for the next job's rollout there).

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
        job = launch("dis-a", wd, disaggregated=True, check_weights=True, timing=True,
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


def test_synced_weights_wait_in_host_memory_until_the_rollout_loads(run: dict[str, Any]) -> None:
    assert run["rc"] == 0, run["log_tail"]
    w = run["weights"]
    assert w["infer_after_sync"] == w["infer_before"]  # Sync left the engine untouched
    assert w["infer"] != w["infer_before"]  # load_states brought the new weights in


def test_the_inference_worker_holds_memory_only_under_its_rollout_permits(run: dict[str, Any]) -> None:
    assert run["rc"] == 0, run["log_tail"]
    rollouts = [r for r in run["records"] if r["phase"] == "rollout" and r["job"] == "dis-a"]
    calls = [c for c in run["state_calls"] if c[0] == "actor_infer" and c[3] <= run["t_done"]]
    assert len(rollouts) == 2 and len(calls) == 4, (rollouts, calls)  # a load and an offload per step
    for r in rollouts:
        inside = [c[1] for c in calls if r["t_start"] <= c[2] and c[3] <= r["t_end"]]
        assert inside == ["load_states", "offload_states"], (r, calls)


def test_a_disaggregated_job_rolls_out_on_the_rollout_pool(run: dict[str, Any]) -> None:
    """actor_infer and actor_train on disjoint GPUs: the job registers disaggregated, so its Rollout
    permit is held on the rollout node and Train and Sync on the training node, and its rollout
    progress goes to the rollout node's gate while that permit is held."""
    assert run["rc"] == 0, run["log_tail"]
    nodes = {(r["phase"], r["node"]) for r in run["records"]}
    assert nodes == {("rollout", "r0"), ("train", "t0"), ("sync", "t0")}, nodes
    done = [f for f, t, phase in run["progress"] if phase == "rollout" and f == t > 0]
    assert len(done) == 2, run["progress"]
