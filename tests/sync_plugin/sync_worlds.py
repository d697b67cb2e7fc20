"""Helpers for the multi-process sync tests: a deterministic mixed-dtype model and a gloo world runner.

Kept outside the test module so spawned processes import only this file (no pytest state).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from typing import Any

SHAPES = (
    ("embed.weight", (37, 13), "float32"),
    ("layers.0.norm", (), "float32"),
    ("layers.0.attn.qkv", (5, 3, 7), "bfloat16"),
    ("layers.0.attn.bias", (11,), "float16"),
    ("layers.0.empty", (0, 4), "float32"),
    ("layers.0.step", (9, 2), "int64"),
    ("layers.1.mlp", (101, 3), "bfloat16"),
    ("head.mask", (1001,), "int8"),
)
"""Mixed dtypes, a scalar, an empty tensor and odd sizes (nothing divides evenly)."""

# (case id, scheme, bucket bytes, how trainers hold the weights)
CASES = (
    ("two_stage-full-small_buckets", "two_stage", 512, "full"),
    ("two_stage-full-one_bucket", "two_stage", 1 << 20, "full"),
    ("two_stage-flat_shard", "two_stage", 700, "flat"),
    ("two_stage-dim0_shard", "two_stage", 900, "dim0"),
    ("star", "star", 1000, "full"),
    ("broadcast", "broadcast", 1000, "full"),
)


def make_model(seed: int = 0) -> dict[str, Any]:
    """Random bits for every parameter (NaN and inf patterns included), identical on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, dtype in SHAPES:
        dt = getattr(torch, dtype)
        n = 1
        for d in shape:
            n *= d
        raw = torch.randint(0, 256, (n * dt.itemsize,), dtype=torch.uint8, generator=g)
        out[name] = raw.view(dt).reshape(shape)
    return out


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(n_trainers: int, n_rollouts: int, timeout_s: float = 60.0) -> dict[int, dict[str, Any]]:
    """Spawn a gloo world, run every case and the bad-metadata case; return per-rank results."""
    ctx = mp.get_context("spawn")
    world = n_trainers + n_rollouts
    port = free_port()
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, n_trainers, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    try:
        for _ in range(world):
            rank, res = q.get(timeout=timeout_s)
            results[rank] = res
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results


def _worker(rank: int, world: int, n_trainers: int, port: int, q: Any) -> None:
    res: dict[str, Any] = {}
    try:
        _run_cases(rank, world, n_trainers, port, res)
    except Exception:
        res["crash"] = traceback.format_exc()
    q.put((rank, res))


def _run_cases(rank: int, world: int, n_trainers: int, port: int, res: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from rollmux import sync_plugin as sp

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    topo = sp.SyncTopology(
        trainer_ranks=tuple(range(n_trainers)), rollout_ranks=tuple(range(n_trainers, world))
    )
    groups = sp.create_groups(topo)
    model = make_model()
    meta = sp.param_metadata(model)
    sp.exchange_metadata(meta, topo)
    for case, scheme, bucket, hold in CASES:
        sharding = sp.Sharding.DIM0 if hold == "dim0" else sp.Sharding.FLAT
        plan = sp.plan_transfer(topo, meta, bucket_bytes=bucket, sharding=sharding)
        if rank in topo.trainer_ranks:
            _trainer_side(sp, model, plan, groups, scheme, hold, rank, n_trainers)
        else:
            bufs = {n: torch.zeros_like(t) for n, t in model.items()}
            sp.receive(bufs, plan, groups, scheme=sp.Scheme(scheme))
            res[case] = [n for n, t in model.items() if not _bitwise_equal(t, bufs[n])]
        dist.barrier()
    _bad_metadata(sp, model, topo, rank, world, res)
    dist.destroy_process_group()


def _trainer_side(
    sp: Any, model: dict, plan: Any, groups: Any, scheme: str, hold: str, rank: int, n: int
) -> None:
    import torch

    if hold == "full":
        sp.send(model, plan, groups, scheme=sp.Scheme(scheme))
        return
    # FSDP-like: build this rank's shard the way FSDP would, then drop the full model.
    if hold == "flat":
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in model.values()])
        lo, hi = rank * flat.numel() // n, (rank + 1) * flat.numel() // n
        shard = [flat[lo:hi].clone()]
    else:
        shard = [_dim0_chunk(t, n, rank) for t in model.values()]
    sp.send_local_shard(shard, plan, groups)


def _dim0_chunk(t: Any, n: int, rank: int) -> Any:
    import torch

    if t.dim() == 0 or t.shape[0] == 0:
        return t.clone() if rank == 0 else t.new_empty((0,))
    chunks = torch.chunk(t, n, dim=0)
    return chunks[rank].clone() if rank < len(chunks) else t.new_empty((0,))


def _bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _bad_metadata(sp: Any, model: dict, topo: Any, rank: int, world: int, res: dict[str, Any]) -> None:
    """The last rollout rank has a different shape for one parameter: every rank must refuse."""
    import torch

    mine = dict(model)
    if rank == world - 1:
        mine["layers.1.mlp"] = torch.zeros((101, 4), dtype=torch.bfloat16)
    try:
        sp.exchange_metadata(sp.param_metadata(mine), topo)
        res["bad_metadata"] = None
    except sp.MetadataMismatchError as e:
        res["bad_metadata"] = str(e)
