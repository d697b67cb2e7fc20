"""Node facts for registration and the per-job GPU memory check, through NVML when it works.

NVML never creates a CUDA context (the sidecar must not). Every NVML call is guarded: no library,
no driver or no GPU degrades to :class:`NoGpuProvider`, whose per-process memory is "unknown" (the
memory check is then skipped), and whose GPU type and count come from the command line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rollmux.model import GpuCatalog

log = logging.getLogger("rollmux.sidecar")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    """What RegisterNode reports about the node's accelerators."""

    gpu_type: str  # GPU catalog key (e.g. "H200")
    gpu_count: int  # GPUs on the node (>= 1; a CPU-only node stands in as 1)
    nvml: dict[str, str]  # free-form facts (driver, per-GPU memory, nvml_available)


class GpuProvider(Protocol):
    """Where GPU facts and per-process GPU memory come from."""

    available: bool  # True when NVML answers

    def facts(self) -> GpuFacts: ...

    def process_memory_bytes(self, pids: Iterable[int]) -> int | None:
        """GPU memory held by `pids` summed over the node's GPUs; None when it cannot be known."""
        ...


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

    def process_memory_bytes(self, pids: Iterable[int]) -> int | None:
        return None


class NvmlProvider:
    """NVML-backed facts (``nvidia-ml-py``): GPU name, count, memory; per-process used memory."""

    available = True

    def __init__(self, pynvml: Any, gpu_type_override: str | None = None) -> None:
        self._nvml = pynvml
        self._count = int(pynvml.nvmlDeviceGetCount())
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]
        name = pynvml.nvmlDeviceGetName(self._handles[0]) if self._handles else "unknown"
        name = name.decode() if isinstance(name, bytes) else str(name)
        self._name = name
        self._type = gpu_type_override or catalog_key(name) or name.replace(" ", "-")

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

    def process_memory_bytes(self, pids: Iterable[int]) -> int | None:
        wanted = set(pids)
        total = 0
        try:
            for h in self._handles:
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid in wanted:
                        if p.usedGpuMemory is None:  # containers / MIG: not reported
                            return None
                        total += int(p.usedGpuMemory)
        except Exception as exc:  # noqa: BLE001 - degrade, never crash the node agent
            log.warning("NVML per-process memory query failed: %s", exc)
            return None
        return total


def catalog_key(nvml_name: str) -> str | None:
    """Map an NVML device name ("NVIDIA H200") onto a GPU catalog key ("H200"), longest match first."""
    keys = sorted(GpuCatalog.default().gpus, key=len, reverse=True)
    tokens = nvml_name.upper().replace("-", " ").split()
    for key in keys:
        if key.upper() in tokens:
            return key
    return None


def detect(gpu_type: str, gpu_count: int, *, use_nvml: bool = True) -> GpuProvider:
    """NVML when it initialises and sees a GPU, else :class:`NoGpuProvider` with the given stand-ins."""
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
        return NvmlProvider(pynvml)
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
