"""What stage 1 reads from NVML about the GPU, and its verdict on it (pure, given an NVML module).

Several ranks share one GPU under RollMux and the sidecar's memory check reads each rank's memory from
NVML by PID, so the device must allow several processes (compute mode DEFAULT), report per-process
memory (no MIG), and list PIDs as this process sees them (no PID namespace between the two).
"""

from __future__ import annotations

from typing import Any

from result import Check

COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


def device_facts(nv: Any, handle: Any) -> dict[str, Any]:
    """Compute mode, MIG mode, persistence and PCIe link of one GPU; a fact NVML refuses is None."""

    def ask(fn: str, *args: Any) -> Any:
        try:
            return getattr(nv, fn)(handle, *args)
        except Exception:  # noqa: BLE001 - not supported on this GPU/driver: unknown
            return None

    mig = ask("nvmlDeviceGetMigMode")
    mode = ask("nvmlDeviceGetComputeMode")
    name = ask("nvmlDeviceGetName")
    return {
        "name": name.decode() if isinstance(name, bytes) else name,
        "compute_mode": None if mode is None else COMPUTE_MODES.get(int(mode), str(mode)),
        "mig_current": None if mig is None else bool(mig[0]),
        "mig_pending": None if mig is None else bool(mig[1]),
        "persistence": None if (p := ask("nvmlDeviceGetPersistenceMode")) is None else bool(p),
        "pcie_gen": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width": ask("nvmlDeviceGetCurrPcieLinkWidth"),
    }


def listed_pids(nv: Any, handles: list[Any]) -> set[int]:
    """The PIDs NVML lists with a compute context on any of the GPUs."""
    out: set[int] = set()
    for h in handles:
        out.update(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
    return out


def env_checks(facts: dict[str, Any], pid_seen: bool) -> list[Check]:
    """Stage 1's verdict on the device: several processes allowed, per-process memory reported, PIDs seen."""
    return [
        Check("compute mode lets several processes share the GPU", facts["compute_mode"], "== DEFAULT",
              facts["compute_mode"] == "DEFAULT"),
        Check("MIG mode (NVML reports no per-process memory under MIG)", facts["mig_current"], "off (False or None)",
              not facts["mig_current"]),
        Check("NVML lists this process's child by its PID (if not: PID namespace?)", pid_seen, "== True", pid_seen),
        Check("persistence mode", facts["persistence"], "printed", None),
        Check("PCIe link generation x width (max generation)",
              f"Gen{facts['pcie_gen']} x{facts['pcie_width']} (max Gen{facts['pcie_gen_max']})", "printed", None),
    ]
