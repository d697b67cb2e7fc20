"""Helpers for the multi-process sync tests: a deterministic mixed-dtype model and a gloo world runner.

Kept outside the test module so spawned processes import only this file (no pytest state).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Any

from rollmux.core.ports import free_port

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


Topology = tuple[tuple[int, ...], tuple[int, ...]]
"""(trainer ranks, rollout ranks) in one world."""

TOPOLOGIES: dict[str, Topology] = {
    "2to3": ((0, 1), (2, 3, 4)),
    "3to2": ((0, 1, 2), (3, 4)),
    "2to3-shuffled": ((4, 1), (0, 3, 2)),
}
"""N_T != N_R both ways, and ranks in no particular order; all share one 5-rank world."""


def run_world(
    world: int, topologies: dict[str, Topology], timeout_s: float = 90.0, backend: str = "gloo"
) -> dict[str, dict[int, dict[str, Any]]]:
    """Spawn one world (gloo on CPU, or NCCL with one GPU per rank) and run every case and the
    bad-metadata case for each topology; return results[topology id][rank][case]."""
    # A forkserver that has imported torch once forks every rank: one torch import instead of five.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "rollmux.sync_plugin"])
    port = free_port()
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, topologies, port, q, backend)) for r in range(world)]
    for p in procs:
        p.start()
    per_rank: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(per_rank) < world:
            try:
                rank, res = q.get(timeout=0.5)
                per_rank[rank] = res
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"ranks {dead} died or timed out; results so far {per_rank}") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return {
        t: {r: res.get(t, {"crash": res.get("crash")}) for r, res in per_rank.items()} for t in topologies
    }


def _worker(rank: int, world: int, topologies: dict[str, Topology], port: int, q: Any, backend: str) -> None:
    res: dict[str, Any] = {"t0": time.time()}
    try:
        _run(rank, world, topologies, port, res, backend)
    except Exception:
        res["crash"] = traceback.format_exc()
    q.put((rank, res))
    q.close()
    q.join_thread()
    os._exit(0)  # skip interpreter teardown (gloo threads, torch atexit): the result is already sent


def _run(rank: int, world: int, topologies: dict[str, Topology], port: int, res: dict, backend: str) -> None:
    import torch
    import torch.distributed as dist

    from rollmux import sync_plugin as sp

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    res["t_imported"] = time.time()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res["t_init"] = time.time()
    model = {n: t.to(device) for n, t in make_model().items()}
    for tid, (trainers, rollouts) in topologies.items():
        topo = sp.SyncTopology(trainer_ranks=trainers, rollout_ranks=rollouts)
        res[tid] = {}
        _run_cases(sp, topo, model, rank, res[tid])
        _bad_metadata(sp, model, topo, rank, res[tid])
    res["t_cases"] = time.time()
    dist.destroy_process_group()


def _run_cases(sp: Any, topo: Any, model: dict, rank: int, res: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    groups = sp.create_groups(topo)
    meta = sp.param_metadata(model)
    sp.exchange_metadata(meta, topo)
    for case, scheme, bucket, hold in CASES:
        sharding = sp.Sharding.DIM0 if hold == "dim0" else sp.Sharding.FLAT
        plan = sp.plan_transfer(topo, meta, bucket_bytes=bucket, sharding=sharding)
        if rank in topo.trainer_ranks:
            _trainer_side(
                sp, model, plan, groups, scheme, hold, topo.trainer_ranks.index(rank), topo.n_trainers
            )
        elif rank in topo.rollout_ranks:
            bufs = {n: torch.zeros_like(t) for n, t in model.items()}
            sp.receive(bufs, plan, groups, scheme=sp.Scheme(scheme))
            if bufs["head.mask"].is_cuda:
                torch.cuda.synchronize()
            res[case] = [n for n, t in model.items() if not _bitwise_equal(t, bufs[n])]
        dist.barrier()


def _trainer_side(
    sp: Any, model: dict, plan: Any, groups: Any, scheme: str, hold: str, idx: int, n: int
) -> None:
    import torch

    if hold == "full":
        sp.send(model, plan, groups, scheme=sp.Scheme(scheme))
        return
    # FSDP-like: build this rank's shard the way FSDP would, then drop the full model.
    if hold == "flat":
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in model.values()])
        lo, hi = idx * flat.numel() // n, (idx + 1) * flat.numel() // n
        shard = [flat[lo:hi].clone()]
    else:
        shard = [_dim0_chunk(t, n, idx) for t in model.values()]
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


def _bad_metadata(sp: Any, model: dict, topo: Any, rank: int, res: dict[str, Any]) -> None:
    """The last rollout rank has a different shape for one parameter: every rank must refuse."""
    import torch

    mine = dict(model)
    if rank == topo.rollout_ranks[-1]:
        mine["layers.1.mlp"] = torch.zeros((101, 4), dtype=torch.bfloat16, device=model["head.mask"].device)
    try:
        sp.exchange_metadata(sp.param_metadata(mine), topo)
        res["bad_metadata"] = None
    except sp.MetadataMismatchError as e:
        res["bad_metadata"] = str(e)
