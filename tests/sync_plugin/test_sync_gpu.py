"""The same cases over NCCL with CUDA tensors, one GPU per rank (skipped without at least two GPUs)."""

from __future__ import annotations

import pytest

from tests.sync_plugin.sync_worlds import CASES, run_world

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs at least two CUDA devices (NCCL cannot put two ranks on one GPU)",
    ),
]


def test_nccl_two_stage_and_baselines_bitwise() -> None:
    world = min(torch.cuda.device_count(), 5)
    n_t = max(1, world // 2)
    topo = (tuple(range(n_t)), tuple(range(n_t, world)))
    results = run_world(world, {"gpu": topo}, timeout_s=180, backend="nccl")["gpu"]
    crashes = {r: res["crash"] for r, res in results.items() if res.get("crash")}
    assert not crashes, crashes
    for r in topo[1]:
        for case, *_ in CASES:
            assert results[r].get(case) == [], f"rank {r} case {case}: {results[r].get(case)}"
        assert "layers.1.mlp" in (results[r].get("bad_metadata") or "")
