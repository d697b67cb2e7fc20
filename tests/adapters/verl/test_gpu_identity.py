"""How a veRL sync rank names its GPU for the NCCL co-location check: Ray gives each worker its own
``CUDA_VISIBLE_DEVICES``, so every worker's current device is 0 and the index alone names no GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
pytest.importorskip("verl")

from rollmux.adapters.verl.checkpoint_engine import gpu_identity, shared_gpus  # noqa: E402


def test_workers_on_different_gpus_without_a_uuid_are_told_apart() -> None:
    ids = [gpu_identity("10.0.0.1", None, visible, 0) for visible in ("3", "5")]
    assert ids == ["10.0.0.1/3", "10.0.0.1/5"]
    assert shared_gpus([{"gpu": i} for i in ids]) == {}


def test_two_workers_on_one_gpu_are_still_caught() -> None:
    ids = [gpu_identity("10.0.0.1", None, "2", 0), gpu_identity("10.0.0.1", None, "2,3", 0)]
    assert shared_gpus([{"gpu": i} for i in ids]) == {"10.0.0.1/2": [0, 1]}


@pytest.mark.parametrize(("uuid", "visible", "index", "expected"), [
    ("GPU-aa", "0", 0, "n/GPU-aa"),  # the UUID wins
    (None, "GPU-bb,GPU-cc", 1, "n/GPU-cc"),  # visibility by UUID
    (None, None, 2, "n/2"),  # nothing narrows visibility: the index is the physical one
    (None, "1", 1, None),  # an index outside the visible list: unknown, never a guess
])
def test_gpu_identity(uuid: str | None, visible: str | None, index: int, expected: str | None) -> None:
    assert gpu_identity("n", uuid, visible, index) == expected
