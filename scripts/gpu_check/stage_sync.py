"""Stage 5: the sync plugin where one GPU allows it.

Two trainer and two rollout processes share the one GPU and move a mixed-dtype model through
``rollmux.sync_plugin.stream`` (the window protocol both adapters use) over the gloo transport, with
the weights on the GPU: every rollout rank must receive them bit for bit. Then one trainer and one
rollout process sync over NCCL on the same GPU: where NCCL allows two ranks on one device the rollout
must receive the model bit for bit; where it refuses, the stage records "not possible on one GPU"
with NCCL's own error text (the veRL backend refuses such a co-located job before any transfer). A
rank that neither finishes nor fails in time fails the stage. ``--cpu``: the same gloo world on CPU
tensors; the NCCL sync is skipped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Any

import result
from result import Check

SHAPES = (("embed", (257, 33), "float32"), ("norm", (), "float32"), ("qkv", (96, 3, 65), "bfloat16"),
          ("bias", (11,), "float16"), ("steps", (9, 2), "int64"), ("mask", (1001,), "int8"))
N_TRAINERS, N_ROLLOUTS = 2, 2


def model(device: str, scale: int) -> dict[str, Any]:
    """Random bits (NaN and inf patterns included) for every parameter, the same in every process."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = {}
    for name, shape, dtype in SHAPES:
        dt = getattr(torch, dtype)
        shape = (shape[0] * scale, *shape[1:]) if shape else shape
        n = 1
        for d in shape:
            n *= d
        out[name] = torch.randint(0, 256, (n * dt.itemsize,), dtype=torch.uint8, generator=g).view(dt) \
            .reshape(shape).to(device)
    return out


def sync_rank(rank: int, size: int, port: int, backend: str, device: str, scale: int, n_trainers: int,
              q: Any) -> None:
    """One rank of the sync world: trainers send the model, rollout ranks compare what arrives."""
    out: dict[str, Any] = {"rank": rank}
    try:
        import torch

        from rollmux.sync_plugin.stream import SyncWorld, WindowStream, connect_store, serve_store

        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL's reason reaches the error text
        if device.startswith("cuda"):
            torch.cuda.set_device(0)
        store = serve_store("127.0.0.1", 60) if rank == 0 else connect_store("127.0.0.1", port, 60)
        if rank == 0:
            q.put(("port", store.port))
        world = SyncWorld("gpu-check", store, rank, size, backend, 60)
        stream = WindowStream(world, n_trainers, window_bytes=64 << 10, bucket_bytes=16 << 10)
        weights = model(device, scale)
        t0 = time.perf_counter()
        if stream.is_trainer:
            out["metrics"] = stream.send(iter(weights.items()), sharded=False)
        else:
            got = {n: t for window in stream.receive() for n, t in window}
            out["bitwise"] = sorted(got) == sorted(weights) and all(
                torch.equal(_bytes(got[n]), _bytes(weights[n])) for n in weights)
            out["device"] = str(next(iter(got.values())).device)
        out["seconds"] = time.perf_counter() - t0
        stream.close()
    except Exception:  # noqa: BLE001 - reported to the parent, which decides
        out["error"] = traceback.format_exc()[-1500:]
    q.put(("result", out))


def _bytes(t: Any) -> Any:
    """A tensor's raw bytes on the host (scalars included), for a bitwise comparison."""
    import torch

    return t.detach().cpu().reshape(-1).view(torch.uint8)


def run_world(size: int, n_trainers: int, backend: str, device: str, scale: int,
              timeout_s: float) -> list[dict[str, Any]]:
    """Start `size` ranks (rank 0 serves the store); their results, or an error per missing rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    first = ctx.Process(target=sync_rank, args=(0, size, 0, backend, device, scale, n_trainers, q))
    first.start()
    kind, port = q.get(timeout=timeout_s)
    if kind != "port":  # rank 0 failed before serving the store
        first.join(5)
        return [port] + [{"rank": r, "error": "rank 0 served no store"} for r in range(1, size)]
    procs = [first] + [ctx.Process(target=sync_rank, args=(r, size, port, backend, device, scale, n_trainers, q))
                       for r in range(1, size)]
    for p in procs[1:]:
        p.start()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < size and time.monotonic() < deadline:
        try:
            kind, value = q.get(timeout=0.5)
            results.append(value)
            if value.get("error"):  # the others may wait on it forever: give them a few seconds, not the limit
                deadline = min(deadline, time.monotonic() + 5)
        except queue.Empty:
            continue
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    missing = {r["rank"] for r in results} ^ set(range(size))
    return results + [{"rank": r, "error": f"no result within {timeout_s}s"} for r in sorted(missing)]


def main() -> int:
    args = result.parse(__doc__.split("\n\n")[0])
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        return result.write(args.out, figures={}, notes=[], checks=[
            Check("torch sees a CUDA device", False, "== True (else run with --cpu)", False)])
    scale = 4 if args.small else 400
    ranks = run_world(N_TRAINERS + N_ROLLOUTS, N_TRAINERS, "gloo", device, scale, 35 if device == "cuda" else 200)
    rollouts = [r for r in ranks if r["rank"] >= N_TRAINERS]
    errors = [f"gloo rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    nbytes = sum(t.numel() * t.element_size() for t in model("cpu", scale).values())
    bitwise = all(r.get("bitwise") for r in rollouts) and not errors
    fig: dict[str, Any] = {
        "processes_on_one_device": N_TRAINERS + N_ROLLOUTS, "transport": "gloo", "tensors_on": device,
        "model_bytes": nbytes, "bitwise_identical": bitwise,
        "received_on": sorted({str(r.get("device")) for r in rollouts}),
        "seconds": round(max((r.get("seconds", 0.0) for r in ranks), default=0.0), 3),
    }
    checks = [Check(f"gloo: {N_TRAINERS} trainers -> {N_ROLLOUTS} rollout ranks on one {device}, bitwise", bitwise,
                    "== True", bitwise),
              Check("the rollout ranks received device tensors", fig["received_on"], f"on {device}",
                    bool(rollouts) and all(str(r.get("device", "")).startswith(device) for r in rollouts))]
    if device == "cuda":
        nccl = run_world(2, 1, "nccl", device, 1, 30)
        fig["nccl_one_trainer_one_rollout"], ok = nccl_outcome(nccl)
        checks.append(Check("NCCL 1 trainer -> 1 rollout on one GPU", fig["nccl_one_trainer_one_rollout"],
                            "bitwise, or NCCL's refusal with its error text", ok))
    else:
        fig["nccl_one_trainer_one_rollout"] = "skipped (no CUDA)"
    return result.write(args.out, figures=fig, notes=errors, checks=checks)


def nccl_outcome(ranks: list[dict[str, Any]]) -> tuple[str, bool]:
    """What the NCCL world did, and whether that is an acceptable outcome. Pure.

    Every rank finished and the rollout received the model bit for bit: accepted. A rank raised: NCCL
    (or torch around it) refused two ranks on one GPU, which is a fact of the device, reported with the
    error's text. A rank that never answered (hung) or a wrong payload fails.
    """
    errors = [r["error"] for r in ranks if r.get("error")]
    silent = ("no result within", "rank 0 served no store")
    raised = [e for e in errors if not e.startswith(silent)]
    if raised:  # the peer of a rank that raised may wait until the deadline: that is not a hang of its own
        text = " ".join(raised[0].strip().splitlines()[-3:])[:400]
        return f"not possible on one GPU: {text}", True
    if errors:
        return f"hung: {errors[0]}", False
    rollout = [r for r in ranks if r["rank"] >= 1]
    if rollout and all(r.get("bitwise") for r in rollout):
        return "accepted: the rollout received the model bit for bit", True
    return "accepted, but the rollout's weights differ", False


if __name__ == "__main__":
    raise SystemExit(main())
