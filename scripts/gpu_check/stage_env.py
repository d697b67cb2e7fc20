"""Stage 1: the environment, and the CUDA context footprint NVML reports per process.

A fresh child process initialises CUDA, runs one matmul, frees it and calls ``empty_cache()``, then
waits; the parent reads the child's ``usedGpuMemory`` through the sidecar's NVML provider (the memory
check's own code path). That is what every idle rank keeps after its phase, so the sidecar's default
per-process limit (``rollmux.sidecar.gpu.DEFAULT_PROCESS_LIMIT_BYTES``) must stay above it. With
``--cpu`` the same child writes a figure to the per-PID stand-in directory instead, and the parent
reads it back through :class:`StandInMemoryProvider`.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile

import result

CHILD = r"""
import os, sys, torch
mode, standin = sys.argv[1], sys.argv[2]
if mode == "cuda":
    torch.cuda.init()
    x = torch.ones(1024, 1024, device="cuda")
    (x @ x).sum().item()
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
else:
    from rollmux.sidecar.gpu import write_standin_bytes
    write_standin_bytes(standin, os.getpid(), 12345)
print("ready", flush=True)
sys.stdin.readline()
"""


def main() -> int:
    args = result.parse(__doc__.split("\n\n")[0])
    import torch

    from rollmux.sidecar.gpu import DEFAULT_PROCESS_LIMIT_BYTES, detect

    fig: dict = {"python": platform.python_version(), "torch": torch.__version__,
                 "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
                 "default_process_limit_bytes": DEFAULT_PROCESS_LIMIT_BYTES}
    notes: list[str] = []
    if not args.cpu and not torch.cuda.is_available():
        return result.write(args.out, ok=False, figures=fig, notes=["no CUDA device: run with --cpu"])
    standin = tempfile.mkdtemp(prefix="gpu-check-standin-")
    provider = detect("H100", 1, memory_standin_dir=standin if args.cpu else None)
    fig["memory_provider"] = type(provider).__name__
    fig.update(provider.facts().nvml)
    if not args.cpu and not provider.available:
        return result.write(args.out, ok=False, figures=fig, notes=["NVML is not available: the memory check "
                                                                    "cannot run (install nvidia-ml-py)"])
    child = subprocess.Popen([sys.executable, "-c", CHILD, "cpu" if args.cpu else "cuda", standin],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "ready":
            return result.write(args.out, ok=False, figures=fig, notes=["the CUDA child did not start"])
        used = provider.process_memory([child.pid])
        child.stdin.write("\n")
        child.stdin.flush()
    finally:
        child.wait(30)
    if used is None:
        return result.write(args.out, ok=False, figures=fig,
                            notes=["the provider cannot tell per-process memory (containers / MIG?)"])
    context = used[child.pid]
    fig["cuda_context_bytes"] = context
    fig["cuda_context_mib"] = round(context / (1 << 20), 1)
    ok = context > 0
    if args.cpu:
        ok = context == 12345  # the stand-in returned what the child wrote
    else:
        fig["limit_over_context"] = round(DEFAULT_PROCESS_LIMIT_BYTES / context, 2) if context else None
        fig["suggested_flag"] = f"--gpu-mem-limit-mib {max(1, -(-2 * context // (1 << 20)))}"
        if context > DEFAULT_PROCESS_LIMIT_BYTES:
            ok = False
            notes.append(f"an idle CUDA process holds {context} bytes, above the default per-process limit "
                         f"{DEFAULT_PROCESS_LIMIT_BYTES}: raise rollmux.sidecar.gpu.CUDA_CONTEXT_BYTES")
    return result.write(args.out, ok=ok, figures=fig, notes=notes)


if __name__ == "__main__":
    raise SystemExit(main())
