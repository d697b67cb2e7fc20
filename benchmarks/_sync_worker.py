"""One rank of the weight sync benchmark; ``sync_netns.py`` starts it inside the rank's namespace.

Handshake with the orchestrator, per scheme (files in ``--dir``): rank 0 writes ``ready_<k>`` once all
ranks are set up, waits for ``go_<k>`` (the orchestrator has read the cut counters), the ranks time
the sync between two barriers, check their replicas bitwise, and rank 0 writes ``done_<k>`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def make_model(total_bytes: int, seed: int = 0) -> dict:
    """Mixed dtypes (bf16 weights, fp32 norms, int64 counters), odd sizes, ``total_bytes`` in all."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n_layers = 8
    small = 4 * 1031 + 8 * 3
    weight_elems = max(1, (total_bytes // n_layers - small) // 2)
    out = {}
    for i in range(n_layers):
        for name, n, dt in ((f"l{i}.w", weight_elems, torch.bfloat16), (f"l{i}.norm", 1031, torch.float32),
                            (f"l{i}.step", 3, torch.int64)):  # fmt: skip
            raw = torch.randint(0, 256, (n * dt.itemsize,), dtype=torch.uint8, generator=g)
            out[name] = raw.view(dt)
    return out


def wait_for(path: Path, timeout_s: float = 600.0) -> None:
    """Poll until ``path`` exists."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {timeout_s} s")
        time.sleep(0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("rank", "world", "trainers", "model-bytes", "bucket-bytes", "depth"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--master", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--schemes", required=True)
    p.add_argument("--dir", type=Path, required=True)
    a = p.parse_args()

    import torch
    import torch.distributed as dist

    from rollmux import sync_plugin as sp

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)
    topo = sp.SyncTopology(
        trainer_ranks=tuple(range(a.trainers)), rollout_ranks=tuple(range(a.trainers, a.world))
    )
    groups = sp.create_groups(topo)
    model = make_model(a.model_bytes)
    meta = sp.param_metadata(model)
    sp.exchange_metadata(meta, topo)
    plan = sp.plan_transfer(topo, meta, bucket_bytes=a.bucket_bytes)
    for k, scheme in enumerate(a.schemes.split(",")):
        result = run_scheme(
            sp, dist, torch, model, plan, groups, sp.Scheme(scheme), a.rank, a.dir, k, a.depth
        )
        if a.rank == 0:
            (a.dir / f"done_{k}.tmp").write_text(json.dumps(result))
            (a.dir / f"done_{k}.tmp").rename(a.dir / f"done_{k}")
    dist.destroy_process_group()


def run_scheme(sp, dist, torch, model, plan, groups, scheme, rank, d: Path, k: int, depth: int) -> dict:  # noqa: ANN001
    """Time one scheme between barriers and check every replica bitwise."""
    rollout = rank in plan.topology.rollout_ranks
    bufs = {n: torch.zeros_like(t) for n, t in model.items()} if rollout else None
    dist.barrier()
    if rank == 0:
        (d / f"ready_{k}").touch()
        wait_for(d / f"go_{k}")
    dist.barrier()
    t0 = time.perf_counter()
    if rollout:
        sp.receive(bufs, plan, groups, scheme=scheme, depth=depth)
    else:
        sp.send(model, plan, groups, scheme=scheme, depth=depth)
    dist.barrier()
    elapsed = time.perf_counter() - t0
    ok = not rollout or all(
        torch.equal(t.view(torch.uint8), bufs[n].view(torch.uint8)) for n, t in model.items()
    )
    oks: list = [None] * dist.get_world_size()
    dist.all_gather_object(oks, ok)
    return {"scheme": scheme.value, "time_s": elapsed, "bitwise_ok": all(oks)}


if __name__ == "__main__":
    main()
