"""RollMux: phase-level multiplexing of synchronous RL post-training jobs.

The in-process API (`rollmux.register`, `rollmux.init`, `rollmux.phase`, `rollmux.runtime_hook`,
`rollmux.register_state`) lives in `rollmux.shim.api`, relocation (`rollmux.relocation`,
`rollmux.relocate`) in `rollmux.shim.relocate`; both are imported on first use, so
`import rollmux` stays cheap and never imports torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SHIM_API = ("init", "phase", "runtime_hook", "register_state", "shutdown", "register", "Registration")
_RELOCATE_API = ("relocation", "relocate")


def __getattr__(name: str) -> Any:
    if name in _SHIM_API:
        from rollmux.shim import api as shim

        return getattr(shim, name)
    if name in _RELOCATE_API:
        from rollmux.shim import relocate

        return getattr(relocate, name)
    raise AttributeError(f"module 'rollmux' has no attribute {name!r}")
