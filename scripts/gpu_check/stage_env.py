"""Stage 1: the environment, what NVML says of the device, and the CUDA context footprint per process.

A fresh child process initialises CUDA, runs one matmul, frees it and calls ``empty_cache()``, then
waits; the parent reads the child's ``usedGpuMemory`` through the sidecar's NVML provider (the memory
check's own code path). That is what every idle rank keeps after its phase, so the sidecar's default
per-process limit (``rollmux.sidecar.gpu.DEFAULT_PROCESS_LIMIT_BYTES``) must stay above it. The device
must also let several processes share it (compute mode), report per-process memory (no MIG) and list
the child under the PID this process knows (no PID namespace in between): ``nvml_facts.py``. With
``--cpu`` the same child writes a figure to the per-PID stand-in directory instead, and the parent
reads it back through :class:`StandInMemoryProvider`.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile

import result
from result import Check

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
                 "nccl": _nccl_version(torch),
                 "default_process_limit_bytes": DEFAULT_PROCESS_LIMIT_BYTES}
    if not args.cpu and not torch.cuda.is_available():
        return result.write(args.out, figures=fig, notes=[], checks=[
            Check("torch sees a CUDA device", False, "== True (else run with --cpu)", False)])
    standin = tempfile.mkdtemp(prefix="gpu-check-standin-")
    provider = detect("H100", 1, memory_standin_dir=standin if args.cpu else None, gpu_type_given=True)
    fig["memory_provider"] = type(provider).__name__
    fig.update(provider.facts().nvml)
    if not args.cpu and not provider.available:
        return result.write(args.out, figures=fig, notes=[], checks=[
            Check("NVML answers (the memory check needs it: nvidia-ml-py)", False, "== True", False)])
    checks: list[Check] = []
    child = subprocess.Popen([sys.executable, "-c", CHILD, "cpu" if args.cpu else "cuda", standin],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "ready":
            return result.write(args.out, figures=fig, notes=[], checks=[
                Check("the CUDA child started", False, "== True", False)])
        used = provider.process_memory([child.pid])
        if not args.cpu:
            import pynvml
            from nvml_facts import device_facts, env_checks, listed_pids

            try:
                handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                facts = device_facts(pynvml, handles[0])
                fig["device"] = facts
                seen = listed_pids(pynvml, handles)
                fig["nvml_pids"] = sorted(seen)[:20]
                fig["child_pid"] = child.pid
                checks += env_checks(facts, child.pid in seen)
            except Exception as exc:  # noqa: BLE001 - reported as a failed check with NVML's words
                checks.append(Check("NVML lists the device's processes", f"{type(exc).__name__}: {exc}", "no error",
                                    False))
    finally:
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.close()  # the child's readline returns and it exits
        child.wait(30)
    if used is None:
        checks.append(Check("the provider tells per-process memory (containers / MIG?)", None, "a figure", False))
        return result.write(args.out, figures=fig, notes=[], checks=checks)
    context = used[child.pid]
    fig["cuda_context_bytes"] = context
    fig["cuda_context_mib"] = round(context / (1 << 20), 1)
    if args.cpu:
        checks.append(Check("the stand-in returned what the child wrote", context, "== 12345", context == 12345))
    else:
        fig["limit_over_context"] = round(DEFAULT_PROCESS_LIMIT_BYTES / context, 2) if context else None
        fig["suggested_flag"] = f"--gpu-mem-limit-mib {max(1, -(-2 * context // (1 << 20)))}"
        checks.append(Check("an idle CUDA process's memory, per NVML (0: NVML does not see the PID)", context,
                            "> 0", context > 0))
        checks.append(Check("the default per-process limit covers one idle CUDA context",
                            fig["limit_over_context"], ">= 1 (else raise rollmux.sidecar.gpu.CUDA_CONTEXT_BYTES)",
                            context <= DEFAULT_PROCESS_LIMIT_BYTES))
    return result.write(args.out, figures=fig, notes=[], checks=checks)


def _nccl_version(torch: object) -> str | None:
    """NCCL's version as torch reports it (a tuple, or an int in older releases); None without CUDA/NCCL."""
    try:
        v = torch.cuda.nccl.version()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a CPU build, or torch without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


if __name__ == "__main__":
    raise SystemExit(main())
