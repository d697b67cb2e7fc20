"""Node facts for registration and the per-process GPU memory check, through NVML when it works.

NVML never creates a CUDA context (the sidecar must not). Every NVML call is guarded: no library,
no driver or no GPU degrades to :class:`NoGpuProvider`, whose per-process memory is "unknown" (the
memory check is then skipped), and whose GPU type and count come from the command line. On a machine
without a GPU, :class:`StandInMemoryProvider` stands in for NVML's per-process figures: each process
writes the bytes it holds to a file named by its PID (:func:`write_standin_bytes`), so a test or the
CPU run of ``scripts/gpu_check.sh`` controls what the memory check sees.

The memory check's limit is per process (:data:`DEFAULT_PROCESS_LIMIT_BYTES`): after its phase, every
process of a job keeps its CUDA context, which NVML counts as the process's memory. A limit below one
context would flag every healthy rank; one far above it would miss real state left behind.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rollmux.core.errors import ErrorCode, RollMuxError
from rollmux.core.model import GpuCatalog

log = logging.getLogger("rollmux.sidecar")

MiB = 1 << 20
CUDA_CONTEXT_BYTES = 512 * MiB
"""The CUDA context footprint NVML reports for one PyTorch process on a Hopper GPU (H100/H200, CUDA 12-13,
lazy module loading, the default since CUDA 11.7): the context, the kernels a first matmul loads and
cuBLAS's workspace, about 0.5 GiB. How it is measured: stage 1 of ``scripts/gpu_check.sh`` starts a fresh
process that runs ``torch.cuda.init()``, one matmul and ``empty_cache()``, then reads its ``usedGpuMemory``
from ``nvmlDeviceGetComputeRunningProcesses``; its ``summary.json`` records the figure and whether
:data:`DEFAULT_PROCESS_LIMIT_BYTES` covers it (docs/how-to/gpu-check.md keeps the measured values)."""

DEFAULT_PROCESS_LIMIT_BYTES = 2 * CUDA_CONTEXT_BYTES
"""Per-process GPU memory a job's rank may keep after its phase: two CUDA contexts (1 GiB). Twice the
context leaves room for the allocator's retained small blocks and a second cuBLAS handle, and is still far
below any real state (a 0.5B-parameter model's bf16 weights are 1 GB; a KV cache is gigabytes)."""


class UnknownGpuError(RollMuxError, ValueError):
    """NVML names a GPU that is not in the catalog and no ``--gpu-type`` says which entry to register."""

    code = ErrorCode.INVALID_ARGUMENT


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    """What RegisterNode reports about the node's accelerators."""

    gpu_type: str  # GPU catalog key (e.g. "H200")
    gpu_count: int  # GPUs on the node (>= 1; a CPU-only node stands in as 1)
    nvml: dict[str, str]  # free-form facts (driver, per-GPU memory, nvml_available)


class GpuMemoryProvider(Protocol):
    """Where the memory check reads each process's GPU memory from."""

    def process_memory(self, pids: Iterable[int]) -> dict[int, int] | None:
        """GPU bytes each of `pids` holds, summed over the node's GPUs (0 for a process holding none);
        None when it cannot be known (no NVML, or NVML does not report per-process figures)."""
        ...


class GpuProvider(GpuMemoryProvider, Protocol):
    """Node facts and per-process GPU memory: what a node agent needs from its GPUs."""

    available: bool  # True when NVML answers

    def facts(self) -> GpuFacts: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryHolder:
    """A process that still holds more GPU memory than the limit."""

    pid: int  # host process id
    used_bytes: int  # GPU bytes it holds, summed over the node's GPUs


def holders_over(used: Mapping[int, int], limit_bytes: int) -> list[MemoryHolder]:
    """The processes holding more than `limit_bytes` each, largest first. Pure."""
    over = [MemoryHolder(pid=pid, used_bytes=b) for pid, b in used.items() if b > limit_bytes]
    return sorted(over, key=lambda h: (-h.used_bytes, h.pid))


class NoGpuProvider:
    """A node without a GPU or NVML: facts from flags, memory check skipped.

    Args:
        gpu_type: the catalog key to register as (a stand-in on CPU-only machines).
        gpu_count: the count to register.
        reason: why NVML is not used (reported in the facts).
    """

    available = False

    def __init__(self, gpu_type: str, gpu_count: int, reason: str = "no NVML") -> None:
        self._facts = GpuFacts(gpu_type=gpu_type, gpu_count=gpu_count,
                               nvml={"nvml_available": "false", "reason": reason[:200]})

    def facts(self) -> GpuFacts:
        return self._facts

    def process_memory(self, pids: Iterable[int]) -> dict[int, int] | None:
        return None


class StandInMemoryProvider(NoGpuProvider):
    """A stand-in for NVML's per-process memory on machines without a GPU: reads ``<directory>/<pid>``.

    Each file holds one integer, the bytes that process says it holds on its GPU (written with
    :func:`write_standin_bytes`); a process without a file holds 0. Facts come from flags, as for
    :class:`NoGpuProvider`. Tests and the CPU run of the GPU check use it to drive the memory check.

    Args:
        directory: where the per-PID files are.
        gpu_type: the catalog key to register as.
        gpu_count: the count to register.
    """

    def __init__(self, directory: str | os.PathLike[str], gpu_type: str, gpu_count: int) -> None:
        super().__init__(gpu_type, gpu_count, f"per-process memory from the stand-in directory {directory}")
        self.directory = Path(directory)

    def process_memory(self, pids: Iterable[int]) -> dict[int, int] | None:
        out = {}
        for pid in pids:
            try:
                out[pid] = int((self.directory / str(pid)).read_text().strip() or 0)
            except FileNotFoundError:
                out[pid] = 0
            except (OSError, ValueError) as exc:
                log.warning("stand-in GPU memory file of pid %d unreadable: %s", pid, exc)
                return None
        return out


def write_standin_bytes(directory: str | os.PathLike[str], pid: int, nbytes: int) -> None:
    """Record that process `pid` holds `nbytes` of (stand-in) GPU memory; atomic, so a reader never
    sees a half-written file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{pid}.tmp"
    tmp.write_text(str(int(nbytes)))
    os.replace(tmp, d / str(pid))


class NvmlProvider:
    """NVML-backed facts (``nvidia-ml-py``): GPU name, count, memory; per-process used memory.

    The registered type is ``gpu_type_override`` when given (the operator's ``--gpu-type``), else the
    catalog key NVML's device name maps to.

    Raises:
        UnknownGpuError: no override and the device name maps to no catalog key (the coordinator would
            refuse the node's registration; the operator must say which catalog entry fits).
    """

    available = True

    def __init__(self, pynvml: Any, gpu_type_override: str | None = None) -> None:
        self._nvml = pynvml
        self._count = int(pynvml.nvmlDeviceGetCount())
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]
        name = pynvml.nvmlDeviceGetName(self._handles[0]) if self._handles else "unknown"
        name = name.decode() if isinstance(name, bytes) else str(name)
        self._name = name
        key = gpu_type_override or catalog_key(name)
        if key is None:
            known = ", ".join(sorted(GpuCatalog.default().gpus))
            raise UnknownGpuError(f"NVML reports a {name!r}, which is not in the GPU catalog ({known}): pass "
                                  "--gpu-type with the catalog key whose figures fit this GPU")
        self._type = key

    def facts(self) -> GpuFacts:
        nv = self._nvml
        facts = {"nvml_available": "true", "gpu_name": self._name}
        try:
            drv = nv.nvmlSystemGetDriverVersion()
            facts["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:  # noqa: BLE001 - optional fact
            pass
        for i, h in enumerate(self._handles):
            try:
                facts[f"gpu{i}_memory_total_bytes"] = str(int(nv.nvmlDeviceGetMemoryInfo(h).total))
            except Exception:  # noqa: BLE001
                continue
        return GpuFacts(gpu_type=self._type, gpu_count=max(1, self._count), nvml=facts)

    def process_memory(self, pids: Iterable[int]) -> dict[int, int] | None:
        """Per-PID used bytes from ``nvmlDeviceGetComputeRunningProcesses`` on every GPU of the node.

        A process with a context on several GPUs is listed once per GPU: its bytes are summed. NVML
        reports ``usedGpuMemory`` as None where it cannot attribute memory (some containers, MIG):
        the answer is then unknown (None), never a guess.
        """
        out = dict.fromkeys(pids, 0)
        try:
            for h in self._handles:
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid not in out:
                        continue
                    if p.usedGpuMemory is None:
                        return None
                    out[p.pid] += int(p.usedGpuMemory)
        except Exception as exc:  # noqa: BLE001 - degrade, never crash the node agent
            log.warning("NVML per-process memory query failed: %s", exc)
            return None
        return out


def catalog_key(nvml_name: str) -> str | None:
    """Map an NVML device name ("NVIDIA H200") onto a GPU catalog key ("H200"), longest match first."""
    keys = sorted(GpuCatalog.default().gpus, key=len, reverse=True)
    tokens = nvml_name.upper().replace("-", " ").split()
    for key in keys:
        if key.upper() in tokens:
            return key
    return None


def detect(gpu_type: str, gpu_count: int, *, use_nvml: bool = True,
           memory_standin_dir: str | None = None, gpu_type_given: bool = False) -> GpuProvider:
    """NVML when it initialises and sees a GPU, else :class:`NoGpuProvider` with the given stand-ins.

    Args:
        gpu_type: catalog key to register when NVML is not used, or always when ``gpu_type_given``.
        gpu_type_given: the operator named ``gpu_type`` (``--gpu-type``): it wins over NVML's device name.
        gpu_count: GPU count to register when NVML is not used.
        use_nvml: False skips NVML.
        memory_standin_dir: read per-process memory from this directory instead of NVML
            (:class:`StandInMemoryProvider`, for machines without a GPU); None: NVML.

    Raises:
        UnknownGpuError: NVML works, names a GPU outside the catalog, and ``gpu_type_given`` is False.
    """
    if memory_standin_dir:
        return StandInMemoryProvider(memory_standin_dir, gpu_type, gpu_count)
    if not use_nvml:
        return NoGpuProvider(gpu_type, gpu_count, "NVML disabled by flag")
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return NoGpuProvider(gpu_type, gpu_count, "nvidia-ml-py not installed")
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return NoGpuProvider(gpu_type, gpu_count, "NVML sees no GPU")
        return NvmlProvider(pynvml, gpu_type if gpu_type_given else None)
    except UnknownGpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return NoGpuProvider(gpu_type, gpu_count, f"NVML unavailable: {exc}")


def host_dram_bytes(meminfo: str = "/proc/meminfo") -> int:
    """Total host DRAM from /proc/meminfo (MemTotal), in bytes; 1 GiB if it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30
