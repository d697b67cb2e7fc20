"""send/receive refuse tensors that do not match the plan before touching torch.distributed."""

from __future__ import annotations

import pytest

from rollmux import sync_plugin as sp

torch = pytest.importorskip("torch")


@pytest.fixture
def plan() -> sp.TransferPlan:
    model = {"w": torch.zeros(4, 3, dtype=torch.bfloat16), "b": torch.zeros(5)}
    topo = sp.SyncTopology(trainer_ranks=(0,), rollout_ranks=(1, 2))
    return sp.plan_transfer(topo, sp.param_metadata(model), bucket_bytes=16)


@pytest.mark.parametrize(
    "tensors,needle",
    [
        ({"w": torch.zeros(4, 3, dtype=torch.bfloat16)}, "got 1 tensors but the plan has 2"),
        ({"w": torch.zeros(4, 4, dtype=torch.bfloat16), "b": torch.zeros(5)}, r"'w' shape=\(4, 3\)"),
        ({"w": torch.zeros(4, 3), "b": torch.zeros(5)}, "dtype=float32"),
    ],
    ids=["count", "shape", "dtype"],
)
def test_send_and_receive_refuse_mismatched_tensors(
    plan: sp.TransferPlan, tensors: dict, needle: str
) -> None:
    with pytest.raises(sp.PlanError, match=needle):
        sp.send(tensors, plan, groups=None)  # type: ignore[arg-type]
    with pytest.raises(sp.PlanError, match=needle):
        sp.receive(tensors, plan, groups=None)  # type: ignore[arg-type]


def test_receive_refuses_non_contiguous_buffers(plan: sp.TransferPlan) -> None:
    bufs = {"w": torch.zeros(3, 4, dtype=torch.bfloat16).t(), "b": torch.zeros(5)}
    with pytest.raises(sp.PlanError, match="not contiguous"):
        sp.receive(bufs, plan, groups=None)  # type: ignore[arg-type]


def test_param_metadata_names_dtypes_without_torch_prefix() -> None:
    meta = sp.param_metadata(
        [("a", torch.zeros(2, dtype=torch.int64)), ("b", torch.zeros((), dtype=torch.float16))]
    )
    assert [(m.name, m.shape, m.dtype, m.nbytes) for m in meta] == [
        ("a", (2,), "int64", 16),
        ("b", (), "float16", 2),
    ]
