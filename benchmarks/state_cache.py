"""Offload and reload bandwidth of the warm-start state cache beside a plain copy of the same bytes.

The state is ``--gb`` GB split into ``--tensors`` tensors of varied sizes and mixed dtypes (float32,
bfloat16, int64), registered with a :class:`rollmux.shim.state_cache.StateCache`. The baseline is
one ``copy_`` of a flat tensor of the same size into a preallocated buffer (pinned on a GPU machine),
measured in the same run. Each figure is the best of ``--repeats`` runs.

    python benchmarks/state_cache.py --gb 2 [--check]

Rows, per direction (offload = device -> host, reload = host -> device), each beside its baseline:

- cache copy: the cache's chunked (multi-stream on CUDA) copies alone, against a plain ``copy_`` into a
  preallocated buffer. On CPU a reload's copy writes into storages that were just reallocated, so its
  pages are populated during the copy (the kernel zero-fills them on first touch); its baseline is
  therefore "alloc+copy": allocate a fresh tensor and copy into it.
- cache e2e: the whole call, including releasing (offload) or reallocating (reload) the device
  storages, against the plain copy plus the same release ("copy+free") or allocation ("alloc+copy")
  that any cache which really frees the memory must do.
- on a GPU machine, the PCIe peak: one big pinned H2D/D2H copy timed with CUDA events, and the
  fraction of it the cache reaches end to end.
- the common alternative: a module holding the same tensors moved with ``module.to("cpu")`` plus
  ``empty_cache()`` (offload) and ``module.to(device)`` (reload), no pinned buffers kept.

It also reports the bytes an offload frees, as the allocator sees them and, on a GPU with NVML, as
NVML reports this process (what the sidecar's memory check reads), and checks that every tensor is
bitwise the same after the round trips. ``--json FILE`` writes all figures (``scripts/gpu_check.sh``
stage 3 reads it). ``--device cuda`` means the current GPU (the cache normalises it to ``cuda:<i>``).

Plain and cache runs are interleaved so both see the same machine load; ``--threads`` defaults to 1
(the tiny jobs run single-threaded, and one thread is steadier on a shared machine). On CPU,
``THP_MEM_ALLOC_ENABLE=1`` (a PyTorch env var: transparent huge pages for large CPU tensors) makes
reallocation about 2x cheaper for both sides.

Target: every ratio >= 0.9x. ``--check`` exits non-zero below target. The default
(``--gb 0.5 --repeats 3``) runs in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import torch

from rollmux.shim.state_cache import StateCache, StateCacheConfig

TARGET = 0.9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


class PlainCopy:
    """The baseline: one flat device tensor and one preallocated host buffer of the same size."""

    def __init__(self, nbytes: int, device: torch.device, pinned: bool) -> None:
        self.nbytes, self.device, self.pinned = nbytes, device, pinned
        self.dev = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self.host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def run(self) -> dict[str, float]:
        """Seconds of D2H and H2D into preallocated buffers, and of allocate + H2D."""
        out = {
            "offload": _timed(self.device, lambda: self.host.copy_(self.dev, non_blocking=self.pinned)),
            "reload": _timed(self.device, lambda: self.dev.copy_(self.host, non_blocking=self.pinned)),
        }
        fresh: list[torch.Tensor] = []
        alloc = lambda: fresh.append(torch.empty_like(self.dev).copy_(self.host, non_blocking=self.pinned))  # noqa: E731
        out["reload_alloc"] = _timed(self.device, alloc)
        out["offload_free"] = _timed(self.device, lambda: self._copy_and_free(fresh))
        return out

    def _copy_and_free(self, fresh: list[torch.Tensor]) -> None:
        self.host.copy_(fresh[0], non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize(self.device)
        fresh.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def pcie_peak(nbytes: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Seconds of one big pinned D2H and H2D copy, timed with CUDA events (best of ``repeats``)."""
    dev = torch.ones(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def timed(dst: torch.Tensor, src: torch.Tensor) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return {
        "offload": min(timed(host, dev) for _ in range(repeats)),
        "reload": min(timed(dev, host) for _ in range(repeats)),
    }


class ToCpu:
    """The alternative: a module whose buffers are the same tensors, moved with ``.to()`` each phase."""

    def __init__(self, nbytes: int, n: int, device: torch.device) -> None:
        self.device, self.module = device, torch.nn.Module()
        for i, t in enumerate(make_state(nbytes, n, device)):
            self.module.register_buffer(f"t{i}", t)

    def run(self) -> dict[str, float]:
        def offload() -> None:
            self.module.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

        return {"offload": _timed(self.device, offload), "reload": _timed(self.device, lambda: self.module.to(self.device))}


def _allocated(device: torch.device) -> int | None:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else None


def _nvml_bytes() -> int | None:
    """This process's GPU memory as NVML reports it (None without NVML)."""
    from rollmux.sidecar.gpu import detect

    provider = detect("H100", 1, gpu_type_given=True)  # any catalog key: only the per-process figure is read
    used = provider.process_memory([os.getpid()])
    return None if used is None else used[os.getpid()]


def make_state(nbytes: int, n: int, device: torch.device) -> list[torch.Tensor]:
    """``n`` tensors of varied sizes (weights 1..n) and mixed dtypes, ``nbytes`` in all."""
    dtypes = [torch.float32, torch.bfloat16, torch.int64]
    weights = list(range(1, n + 1))
    out = []
    for i, w in enumerate(weights):
        dtype = dtypes[i % len(dtypes)]
        size = nbytes * w // sum(weights) // dtype.itemsize
        out.append(torch.full((size,), i + 1, dtype=dtype, device=device))
    return out


def build_cache(
    nbytes: int, device: torch.device, args: argparse.Namespace
) -> tuple[StateCache, list[torch.Tensor]]:
    """A cache over ``make_state`` tensors, its host buffers reserved (pinned once) up front."""
    tensors = make_state(nbytes, args.tensors, device)
    config = StateCacheConfig(chunk_bytes=args.chunk_mb << 20, num_streams=args.streams)
    cache = StateCache("bench", device=device, config=config)
    for i, t in enumerate(tensors):
        cache.register_tensor(f"t{i}", t)
    cache.reserve(cache.device_bytes() + args.tensors * config.alignment)
    return cache, tensors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=0.5, help="state size in GB (1e9 bytes)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is kept")
    parser.add_argument("--tensors", type=int, default=16, help="number of registered tensors")
    parser.add_argument("--chunk-mb", type=int, default=64, help="chunk size in MiB")
    parser.add_argument("--streams", type=int, default=4, help="CUDA streams (ignored on CPU)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check", action="store_true", help=f"exit 1 below {TARGET}x of the baseline")
    parser.add_argument("--json", default=None, help="write every figure to this JSON file")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    from rollmux.shim.state_cache import canonical_device

    device = canonical_device(args.device)
    pinned = device.type == "cuda"
    nbytes = int(args.gb * 1e9)
    peak = pcie_peak(nbytes, device, args.repeats) if device.type == "cuda" else None
    plain_copy = PlainCopy(nbytes, device, pinned)
    to_cpu = ToCpu(nbytes, args.tensors, device) if device.type == "cuda" else None  # a no-op on the CPU
    cache, tensors = build_cache(nbytes, device, args)
    cached = cache.device_bytes()
    reference = [t.clone() for t in tensors]  # bitwise reference, compared after the round trips
    allocations = cache.host_allocations
    freed = _freed(cache, device)
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # interleaved, so all see the same machine load
        for key, value in plain_copy.run().items():
            runs.setdefault(f"plain_{key}", []).append(value)
        for key, value in (to_cpu.run() if to_cpu else {}).items():
            runs.setdefault(f"tocpu_{key}", []).append(value)
        for stats in (cache.offload(), cache.reload()):
            runs.setdefault(f"copy_{stats.direction}", []).append(stats.copy_s)
            runs.setdefault(f"e2e_{stats.direction}", []).append(stats.total_s)
    if cache.host_allocations != allocations:
        raise SystemExit("host buffers were reallocated between phases; the cache must pin once")
    bitwise = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(tensors, reference))
    del reference
    best = {k: min(v) for k, v in runs.items()}
    plain = {k.removeprefix("plain_"): v for k, v in best.items() if k.startswith("plain_")}
    copy_s = {k.removeprefix("copy_"): v for k, v in best.items() if k.startswith("copy_")}
    total_s = {k.removeprefix("e2e_"): v for k, v in best.items() if k.startswith("e2e_")}

    def gbps(n: int, s: float) -> float:
        return n / s / 1e9

    print(
        f"state cache: {cached / 1e9:.2f} GB in {args.tensors} tensors on {device} "
        f"(torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r}, chunk {args.chunk_mb} MiB, "
        f"{args.streams if pinned else 1} stream(s), host {'pinned' if pinned else 'pageable'}), best of {args.repeats}"
    )
    header = (
        f"{'direction':<9} {'baseline (plain)':>21} {'cache copy':>10} {'ratio':>6} "
        f"{'cache e2e':>10} {'baseline (plain)':>21} {'ratio':>6}"
    )
    if peak:
        header += f" {'PCIe peak':>10} {'e2e/peak':>8}"
    print(header)
    ok = True
    # Baselines: the copy column against a plain copy, except a CPU reload, whose copy populates fresh
    # pages and so is compared with alloc+copy; the end-to-end column against the plain copy plus the
    # release (offload) or allocation (reload) that any cache which really frees memory must do.
    for direction, copy_base, e2e_base in (
        ("offload", "offload", "offload_free"),
        ("reload", "reload" if pinned else "reload_alloc", "reload_alloc"),
    ):
        plain_bw = gbps(nbytes, plain[copy_base])
        copy_bw, e2e_bw = gbps(cached, copy_s[direction]), gbps(cached, total_s[direction])
        base_bw = gbps(nbytes, plain[e2e_base])
        r_copy, r_e2e = copy_bw / plain_bw, e2e_bw / base_bw
        ok &= r_copy >= TARGET and r_e2e >= TARGET
        names = {
            "offload": "copy",
            "reload": "copy",
            "offload_free": "copy+free",
            "reload_alloc": "alloc+copy",
        }
        line = (
            f"{direction:<9} {plain_bw:>5.2f} GB/s {names[copy_base]:>10} {copy_bw:>5.2f} GB/s {r_copy:>5.2f}x "
            f"{e2e_bw:>5.2f} GB/s {names[e2e_base]:>10} {base_bw:>5.2f} GB/s {r_e2e:>5.2f}x"
        )
        if peak:
            peak_bw = gbps(nbytes, peak[direction])
            line += f" {peak_bw:>5.2f} GB/s {e2e_bw / peak_bw:>7.2f}x"
        print(line)
    tocpu = {d: gbps(cached, min(runs[f"tocpu_{d}"])) for d in ("offload", "reload")} if to_cpu else None
    e2e = {d: gbps(cached, total_s[d]) for d in ("offload", "reload")}
    for d in ("offload", "reload") if tocpu else ():
        print(f"{d:<9} cache e2e {e2e[d]:>5.2f} GB/s vs module.to({'cpu' if d == 'offload' else 'device'})"
              f"{' + empty_cache' if d == 'offload' else ''} {tocpu[d]:>5.2f} GB/s: {e2e[d] / tocpu[d]:.2f}x")
    print(f"offload frees {freed['allocator_bytes'] if freed['allocator_bytes'] is not None else 'n/a'} bytes "
          f"(allocator), {freed['nvml_bytes'] if freed['nvml_bytes'] is not None else 'n/a'} bytes (NVML) of "
          f"{cached}; bitwise identical after {args.repeats} round trips: {bitwise}")
    print(f"target: >= {TARGET}x in every ratio column -> {'met' if ok else 'NOT met'}")
    if args.json:
        peak_gbps = {d: gbps(nbytes, peak[d]) for d in peak} if peak else None
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({
                "device": str(device), "state_bytes": cached, "repeats": args.repeats,
                "cache_e2e_gbps": e2e, "cache_copy_gbps": {d: gbps(cached, copy_s[d]) for d in copy_s},
                "plain_copy_gbps": {d: gbps(nbytes, plain[d]) for d in ("offload", "reload")},
                "to_cpu_gbps": tocpu, "cache_vs_plain_copy": {d: e2e[d] / gbps(nbytes, plain[d]) for d in e2e},
                "cache_vs_to_cpu": {d: e2e[d] / tocpu[d] for d in e2e} if tocpu else None,
                "pcie_peak_gbps": peak_gbps,
                "pcie_fraction": {d: e2e[d] / peak_gbps[d] for d in e2e} if peak_gbps else None,
                "freed": freed, "bitwise_identical": bitwise, "target_met": ok}, f, indent=2)
    return 1 if (args.check and not ok) or not bitwise else 0


def _freed(cache: StateCache, device: torch.device) -> dict[str, int | None]:
    """Bytes one offload frees (allocator and NVML), measured around a first offload/reload."""
    _sync(device)
    before = (_allocated(device), _nvml_bytes() if device.type == "cuda" else None)
    resident = cache.device_bytes()
    cache.offload()
    _sync(device)
    after = (_allocated(device), _nvml_bytes() if device.type == "cuda" else None)
    released = resident - cache.device_bytes()
    cache.reload()
    return {"cache_bytes": released,"allocator_bytes": None if before[0] is None or after[0] is None else before[0] - after[0],
            "nvml_bytes": None if before[1] is None or after[1] is None else before[1] - after[1],
            "host_bytes": cache.host_bytes()}


if __name__ == "__main__":
    sys.exit(main())
