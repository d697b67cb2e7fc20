"""The transfer plan as pure data: coverage, one copy across the cut, load balance, bad topologies."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from rollmux.core.errors import RollMuxError
from rollmux.sync_plugin import (
    ParamMeta,
    PlanError,
    Sharding,
    SyncTopology,
    TopologyError,
    TransferPlan,
    plan_full_buckets,
    plan_transfer,
)


def meta(*sizes: tuple[tuple[int, ...], int]) -> tuple[ParamMeta, ...]:
    """Parameters p0, p1, ... with the given (shape, itemsize)."""
    return tuple(
        ParamMeta(name=f"p{i}", shape=s, dtype=f"t{k}", itemsize=k) for i, (s, k) in enumerate(sizes)
    )


def topo(n_t: int, n_r: int) -> SyncTopology:
    return SyncTopology(trainer_ranks=tuple(range(n_t)), rollout_ranks=tuple(range(n_t, n_t + n_r)))


MIXED = meta(((37, 13), 4), ((), 4), ((5, 3, 7), 2), ((0, 4), 4), ((9, 2), 8), ((1001,), 1))


def check_plan(plan: TransferPlan) -> None:
    """Every model byte reaches exactly one piece and lands exactly once in its parameter."""
    n_r = plan.topology.n_rollouts
    landed = [bytearray(m.nbytes) for m in plan.metadata]
    for b in plan.buckets:
        covered = bytearray(b.piece_bytes * n_r)
        for t in b.transfers:
            chunk = b.chunks[t.trainer]
            assert chunk.start <= t.src_offset and t.src_offset + t.length <= chunk.stop
            lo = t.rollout * b.piece_bytes + t.dst_offset
            assert t.dst_offset + t.length <= b.piece_bytes
            for i in range(lo, lo + t.length):
                covered[i] += 1
        assert covered[: b.nbytes] == b"\x01" * b.nbytes
        assert sum(p.length for p in b.placements) == b.nbytes
        for p in b.placements:
            for i in range(p.param_offset, p.param_offset + p.length):
                landed[p.param][i] += 1
    for m, got in zip(plan.metadata, landed):
        assert got == b"\x01" * m.nbytes, m.name


@pytest.mark.parametrize("sharding", list(Sharding), ids=lambda s: s.value)
@pytest.mark.parametrize("n_t,n_r", [(1, 1), (2, 3), (3, 2), (4, 4), (1, 8), (8, 3)], ids=lambda v: str(v))
@pytest.mark.parametrize("bucket", [64, 1000, 1 << 20])
def test_plan_covers_every_byte_once(sharding: Sharding, n_t: int, n_r: int, bucket: int) -> None:
    plan = plan_transfer(topo(n_t, n_r), MIXED, bucket_bytes=bucket, sharding=sharding)
    check_plan(plan)
    assert plan.cut_bytes() == plan.total_bytes
    assert sum(plan.local_bytes(t) for t in range(n_t)) == plan.total_bytes


def test_random_models_seeded() -> None:
    rng = random.Random(7)
    for _ in range(30):
        sizes = [
            ((rng.randint(0, 40), rng.randint(1, 5)), rng.choice([1, 2, 4, 8]))
            for _ in range(rng.randint(1, 9))
        ]
        plan = plan_transfer(
            topo(rng.randint(1, 5), rng.randint(1, 6)),
            meta(*sizes),
            bucket_bytes=rng.randint(1, 500),
            sharding=rng.choice(list(Sharding)),
        )
        check_plan(plan)


def test_equal_counts_map_trainer_i_to_rollout_i() -> None:
    plan = plan_transfer(topo(4, 4), meta(((4096,), 4)), bucket_bytes=4096)
    for b in plan.buckets:
        assert {(t.trainer, t.rollout) for t in b.transfers} == {(i, i) for i in range(4)}


@pytest.mark.parametrize("n_t,n_r", [(2, 3), (3, 2), (2, 8)])
def test_stage1_load_is_balanced(n_t: int, n_r: int) -> None:
    plan = plan_transfer(topo(n_t, n_r), meta(((1 << 16,), 4)), bucket_bytes=1 << 14)
    recv = [0] * n_r
    sent = [0] * n_t
    for b in plan.buckets:
        for t in b.transfers:
            recv[t.rollout] += t.length
            sent[t.trainer] += t.length
    m = plan.total_bytes
    assert max(recv) - min(recv) <= n_r * len(plan.buckets)  # ceil-sized pieces: < n_r bytes per bucket
    assert sum(recv) == m
    assert max(sent) - min(sent) <= n_t


def test_dim0_ownership_matches_torch_chunk() -> None:
    plan = plan_transfer(topo(3, 2), meta(((7, 2), 4), ((), 8)), bucket_bytes=1000, sharding=Sharding.DIM0)
    # 7 rows in chunks of 3: rows 0-2, 3-5, 6; row = 8 bytes; the scalar belongs to trainer 0.
    assert [plan.local_bytes(t) for t in range(3)] == [24 + 8, 24, 8]


def test_full_buckets_cover_model() -> None:
    buckets = plan_full_buckets(MIXED, bucket_bytes=333)
    assert sum(b.nbytes for b in buckets) == sum(m.nbytes for m in MIXED)
    assert all(sum(p.length for p in b.placements) == b.nbytes for b in buckets)


@pytest.mark.parametrize(
    "trainers,rollouts,needle",
    [
        ((0, 1), (1, 2), r"ranks \[1\] are in both"),
        ((), (1, 2), "trainer_ranks is empty"),
        ((0,), (), "rollout_ranks is empty"),
        ((0, 0), (1,), "more than once"),
        ((-1,), (1,), "negative"),
    ],
    ids=["overlap", "no_trainers", "no_rollouts", "duplicate", "negative"],
)
def test_bad_topology_names_the_problem(trainers: tuple, rollouts: tuple, needle: str) -> None:
    with pytest.raises(TopologyError, match=needle) as info:
        SyncTopology(trainer_ranks=trainers, rollout_ranks=rollouts)
    assert isinstance(info.value, RollMuxError)


def test_rank_outside_world_refused() -> None:
    with pytest.raises(TopologyError, match=r"ranks \[5\].*world_size=4"):
        SyncTopology(trainer_ranks=(0, 1), rollout_ranks=(2, 5)).check_world(4)


def test_bad_plan_inputs() -> None:
    with pytest.raises(PlanError, match="bucket_bytes=0"):
        plan_transfer(topo(1, 1), MIXED, bucket_bytes=0)
    with pytest.raises(PlanError, match="'p0' appears twice"):
        plan_transfer(topo(1, 1), MIXED[:1] * 2)


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import rollmux.sync_plugin as sp\n"
        "t = sp.SyncTopology(trainer_ranks=(0,), rollout_ranks=(1, 2))\n"
        "p = sp.plan_transfer(t, (sp.ParamMeta(name='w', shape=(3,), dtype='float32', itemsize=4),), 4)\n"
        "assert 'torch' not in sys.modules and p.cut_bytes() == 12\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
