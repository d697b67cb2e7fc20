"""Environment variables the node sidecar daemon reads, each named once.

Its socket path (``ROLLMUX_SIDECAR_SOCKET``) is declared with the sidecar protocol in
``rollmux.wire.env``, since the shim reads it too; the coordinator address is the coordinator's own
variable (``rollmux.wire.env.COORDINATOR``).
"""

from __future__ import annotations

SOCKET_DIR = "ROLLMUX_SOCKET_DIR"
"""Directory of the sidecar's default socket (default ``/run/rollmux``)."""

GPU_MEMORY_STANDIN = "ROLLMUX_GPU_MEMORY_STANDIN"
"""Sidecar, machines without a GPU only: a directory of ``<pid>`` files, each holding the GPU bytes that
process says it holds; the sidecar's memory check reads them instead of NVML (a stand-in used by tests
and ``scripts/gpu_check.sh --cpu``; ``rollmux sidecar --gpu-memory-standin``). The tiny GRPO demo's ranks
write theirs with ``--gpu-memory-standin``. Unset: NVML."""
