"""Two-stage sync and baselines across real processes with gloo: bitwise replicas, N_T != N_R, FSDP shards."""

from __future__ import annotations

import pytest

from tests.sync_plugin.sync_worlds import CASES, run_world

pytest.importorskip("torch")

WORLDS = [(2, 3), (3, 2)]


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{t}to{r}" for t, r in WORLDS])
def world(request: pytest.FixtureRequest) -> tuple[int, int, dict]:
    n_t, n_r = request.param
    return n_t, n_r, run_world(n_t, n_r)


def test_no_rank_crashed(world: tuple[int, int, dict]) -> None:
    n_t, n_r, results = world
    assert sorted(results) == list(range(n_t + n_r))
    crashes = {r: res["crash"] for r, res in results.items() if "crash" in res}
    assert not crashes, crashes


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_every_rollout_rank_gets_bitwise_replica(world: tuple[int, int, dict], case: str) -> None:
    n_t, n_r, results = world
    for r in range(n_t, n_t + n_r):
        assert results[r].get(case) == [], f"rank {r} case {case}: differing params {results[r].get(case)}"


def test_mismatched_parameter_lists_refused_on_every_rank(world: tuple[int, int, dict]) -> None:
    n_t, n_r, results = world
    last = n_t + n_r - 1
    for r, res in results.items():
        msg = res.get("bad_metadata")
        assert msg is not None, f"rank {r} did not refuse"
        assert "layers.1.mlp" in msg and f"rank {last}" in msg and "(101, 4)" in msg
