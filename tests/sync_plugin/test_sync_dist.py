"""Two-stage sync and baselines across real processes with gloo: bitwise replicas, N_T != N_R, FSDP shards.

One 5-rank world is spawned per module and runs every topology of ``TOPOLOGIES`` in turn.
"""

from __future__ import annotations

import pytest

from tests.sync_plugin.sync_worlds import CASES, TOPOLOGIES, run_world

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def results() -> dict:
    return run_world(5, TOPOLOGIES)


@pytest.mark.parametrize("tid", list(TOPOLOGIES))
def test_no_rank_crashed(results: dict, tid: str) -> None:
    assert sorted(results[tid]) == list(range(5))
    crashes = {r: res["crash"] for r, res in results[tid].items() if res.get("crash")}
    assert not crashes, crashes


@pytest.mark.parametrize("case", [c[0] for c in CASES])
@pytest.mark.parametrize("tid", list(TOPOLOGIES))
def test_every_rollout_rank_gets_bitwise_replica(results: dict, tid: str, case: str) -> None:
    for r in TOPOLOGIES[tid][1]:
        got = results[tid][r].get(case)
        assert got == [], f"rank {r} case {case}: differing params {got}"


@pytest.mark.parametrize("tid", list(TOPOLOGIES))
def test_mismatched_parameter_lists_refused_on_every_rank(results: dict, tid: str) -> None:
    last = TOPOLOGIES[tid][1][-1]
    for r, res in results[tid].items():
        msg = res.get("bad_metadata")
        assert msg is not None, f"rank {r} did not refuse"
        assert "layers.1.mlp" in msg and f"rank {last}" in msg and "(101, 4)" in msg
