"""The real ROLL ``RLVRPipeline.run()`` for 2 steps on CPU, variable unset: ROLL runs as shipped (no
RollMux module or patch in the driver's Ray workers) and trains (step 0 reaches train_step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .testbed import launch, roll_unavailable, stable_metrics

_reason = roll_unavailable()
if _reason:
    print(f"ROLL pipeline tests skipped: {_reason}")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(_reason is not None, reason=str(_reason))]


def test_rlvr_two_steps_unset_variable_patches_no_worker(tmp_path: Path) -> None:
    res = launch("solo", tmp_path).wait(timeout_s=800)
    assert res["rc"] == 0, res["log_tail"]
    steps = res["steps"]
    assert len(steps) == 2
    assert "actor/pg_loss@sum" in steps[0] and "actor_train/grad_norm" in steps[0]  # a real train_step ran
    assert stable_metrics(steps[0])["token/response_length/mean"] > 0
    workers = res["workers"]
    assert {"actor_train/0", "actor_infer/0", "reference/0"} <= workers.keys()
    assert all(not w.get("loaded") and not w.get("applied") for w in workers.values()), workers
