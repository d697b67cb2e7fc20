"""Trainer state between phases: veRL's own offload (what its worker ``to("cpu")`` / ``to("device")`` RPC
runs) against RollMux's ``StateCache``, on the same FSDP2-sharded state in one process.

    python benchmarks/verl_offload.py [--hidden 2048 --layers 12] [--repeats 5]

The state is a randomly initialised Qwen2-shaped model (no download) sharded with FSDP2's
``fully_shard`` on a one-rank process group (NCCL on a GPU, gloo on the CPU), after one AdamW step:
fp32 parameters, their gradients and the two Adam moments, as a veRL actor holds them between phases.

- **veRL path**: exactly the calls ``FSDPEngine.to`` makes (``verl/workers/engine/fsdp/transformer_impl.py``):
  offload = ``fsdp_utils.offload_fsdp_model_to_cpu(module)`` (FSDP2: ``module.to("cpu",
  non_blocking=True)``, gradients included, then ``empty_cache``) + ``offload_fsdp_optimizer(optimizer)``
  (every state tensor ``.to("cpu", non_blocking=True)``, fresh host memory each time); reload =
  ``load_fsdp_model_to_gpu`` + ``load_fsdp_optimizer``. veRL returns without synchronising; the
  timing here ends with a device synchronise, since the memory is only free (or the state usable)
  then.
- **StateCache path**: every local shard (``DTensor.to_local()``) of the parameters, gradients and
  optimizer state registered with ``StateCache.register_tensor`` (``register_module`` walks the
  ``DTensor`` parameters themselves, whose ``untyped_storage()`` is not the shard's storage);
  host chunks allocated (pinned on CUDA) at the first offload and kept, copies chunked over
  ``num_streams`` CUDA side streams, device storages resized to 0 (offload) and back (reload).

Each path has its own copy of the state (same seed, same bytes: veRL's path replaces the tensors
that a cache registered), both on the device. The two paths alternate, ``--repeats`` rounds each
(plus one untimed warm-up round each: the
StateCache pins its buffers there, once per job in practice); each figure is the median, with GB/s =
state bytes / seconds and the device memory the offload freed (the least over the rounds). Both
paths must give the state back bit for bit after all rounds (checked). On a CPU-only machine the device is the CPU: veRL's
``to("cpu")`` then moves nothing (the state already is in host memory) while the StateCache still
copies every byte, so the CPU figures only show that path's fixed costs; the comparison that decides
the adapter's choice is the CUDA one (run this on a GPU machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollmux.core.ports import free_port

HARNESS = Path(__file__).resolve().parents[1] / "tests" / "adapters" / "verl" / "harness"


def build_state(device: Any, hidden: int, layers: int, vocab: int) -> tuple[Any, Any]:
    """A one-rank FSDP2 Qwen2-shaped model and its AdamW optimizer after one step (grads kept)."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=max(hidden // 128, 2),
                      num_key_value_heads=max(hidden // 512, 1), max_position_embeddings=256,
                      tie_word_embeddings=False, attn_implementation="eager")
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (2, 32), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # grads stay: veRL's to(..., grad=True) moves them too
    return model, opt


def _tensors(model: Any, opt: Any) -> list[Any]:
    """Local shards of every parameter, gradient and optimizer state tensor, in a fixed order."""
    import torch

    def local(t: Any) -> Any:
        return t.to_local() if hasattr(t, "to_local") else t

    out = []
    for p in model.parameters():
        out.append(local(p))
        if p.grad is not None:
            out.append(local(p.grad))
    for per_param in opt.state.values():
        out += [local(v) for k, v in sorted(per_param.items()) if torch.is_tensor(v) and k != "step"]
    return out


def fingerprint(model: Any, opt: Any) -> list[bytes]:
    """Bytes of every state tensor (to check a round trip gives the state back bit for bit)."""
    import torch

    # a copy: numpy over a CPU tensor's own storage would make it non-resizable, so no cache could free it
    return [t.detach().to("cpu", copy=True).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for t in _tensors(model, opt)]


def state_bytes(model: Any, opt: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(model, opt))


def timed(sync: Callable[[], None], fn: Callable[[], object]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 2048 on CUDA, 512 on CPU)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 12 on CUDA, 4 on CPU)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000 on CUDA, 8192 on CPU)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per path (median; default 5)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1, as veRL's CPU harness workers run)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)

    cuda = torch.cuda.is_available()
    if not cuda:  # veRL's device helpers need a platform; the harness's CPU platform is what its CPU jobs use
        os.environ["VERL_PLATFORM"] = "cpu"
        sys.path.insert(0, str(HARNESS))
        import rollmux_verl_cpu  # noqa: F401 - registers the platform on import
    from verl.utils import fsdp_utils
    from verl.utils.device import get_device_name

    from rollmux.shim.state_cache import StateCache

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    try:
        hidden, layers = args.hidden or (2048 if cuda else 512), args.layers or (12 if cuda else 4)
        vocab = args.vocab or (32000 if cuda else 8192)
        model, opt = build_state(device, hidden, layers, vocab)  # moved by veRL's path
        cached_model, cached_opt = build_state(device, hidden, layers, vocab)  # moved by the StateCache
        nbytes = state_bytes(model, opt)
        before = fingerprint(model, opt)
        if fingerprint(cached_model, cached_opt) != before:
            raise SystemExit("the two copies of the state differ: the model build is not deterministic")

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)

        def allocated() -> int:
            return torch.cuda.memory_allocated(device) if cuda else 0

        name = get_device_name()  # what FSDPEngine.to passes: "cuda" on a GPU, "cpu" on the harness platform

        def verl_off() -> None:  # FSDPEngine.to("cpu", model=True, optimizer=True, grad=True)
            fsdp_utils.offload_fsdp_model_to_cpu(model)
            fsdp_utils.offload_fsdp_optimizer(opt)

        def verl_on() -> None:  # FSDPEngine.to(device_name, ...)
            fsdp_utils.load_fsdp_model_to_gpu(model)
            fsdp_utils.load_fsdp_optimizer(opt, name)

        cache = StateCache("verl-offload-bench", device=device)
        for i, t in enumerate(_tensors(cached_model, cached_opt)):
            cache.register_tensor(f"shard{i}", t)
        paths: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "veRL to(cpu)/to(device)": (verl_off, verl_on), "StateCache": (cache.offload, cache.reload)}
        states = {"veRL to(cpu)/to(device)": (model, opt), "StateCache": (cached_model, cached_opt)}
        times: dict[str, dict[str, list[float]]] = {p: {"offload": [], "reload": [], "freed": []} for p in paths}
        for i in range(args.repeats + 1):  # round 0 is the warm-up (pinning, allocator, streams)
            for path, (off, on) in paths.items():
                held = allocated()
                t_off = timed(sync, off)
                if cuda:
                    torch.cuda.empty_cache()
                freed = held - allocated()
                t_on = timed(sync, on)
                if i:
                    times[path]["offload"].append(t_off)
                    times[path]["reload"].append(t_on)
                    times[path]["freed"].append(freed)
        for path, state in states.items():
            if fingerprint(*state) != before:
                raise SystemExit(f"{path}: the state after {args.repeats + 1} round trips differs from before")
        cache.release()
    finally:
        dist.destroy_process_group()

    print(f"trainer state: {nbytes / 1e9:.3f} GB on {device} (Qwen2-shaped, hidden {hidden}, {layers} layers, vocab "
          f"{vocab}; fp32 params + grads + Adam moments, FSDP2, 1 rank); median of {args.repeats} rounds")
    print(f"{'path':<26}{'offload s':>10}{'GB/s':>9}{'reload s':>10}{'GB/s':>9}{'device GB freed':>17}")
    for path, t in times.items():
        off, on = statistics.median(t["offload"]), statistics.median(t["reload"])
        freed = f"{min(t['freed']) / 1e9:.3f}" if cuda else "-"
        moves = cuda or path == "StateCache"  # on the CPU veRL's to("cpu") moves no bytes: no rate to print
        rate = (f"{nbytes / off / 1e9:>9.2f}", f"{nbytes / on / 1e9:>9.2f}") if moves else (f"{'-':>9}",) * 2
        print(f"{path:<26}{off:>10.4f}{rate[0]}{on:>10.4f}{rate[1]}{freed:>17}")
    v, c = (statistics.median(times[p]["offload"]) + statistics.median(times[p]["reload"]) for p in paths)
    print(f"offload+reload: StateCache / veRL = {c / v:.2f}x; faster: {'StateCache' if c < v else 'veRL to()'}"
          + ("" if cuda else " (CPU: veRL's to('cpu') moves no bytes here; decide on a GPU)"))
    print("round trips bit for bit: yes (both paths)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
