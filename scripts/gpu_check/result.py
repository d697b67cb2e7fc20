"""What every stage script shares: its command line, its checks, and how it writes its result."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Check:
    """One judged figure: what was measured beside the threshold it must meet."""

    name: str  # what it proves, e.g. "offload >= 0.7x PCIe peak"
    measured: Any  # the figure (a number, a string or a list)
    threshold: str  # the rule, printed beside it, e.g. ">= 0.7"
    ok: bool | None  # None: printed but not judged in this mode (e.g. bandwidth on shared CPU cores)


def at_least(name: str, measured: float | None, minimum: float, *, judged: bool = True, digits: int = 3) -> Check:
    """``measured >= minimum``; a missing figure fails where it is judged."""
    shown = None if measured is None else round(measured, digits)
    return Check(name, shown, f">= {minimum}", (measured is not None and measured >= minimum) if judged else None)


def parse(description: str, argv: list[str] | None = None, **extra: Any) -> argparse.Namespace:
    """``--out FILE`` (the result), ``--cpu``, ``--small``, plus ``extra`` flags (name -> default)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, type=Path, help="where the stage writes its JSON result")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and the per-PID stand-in instead of NVML")
    p.add_argument("--small", action="store_true", help="scaled-down sizes")
    for name, default in extra.items():
        p.add_argument(f"--{name.replace('_', '-')}", default=default, type=type(default) if default is not None else str)
    return p.parse_args(argv)


def write(path: Path, *, figures: dict[str, Any], notes: list[str], checks: list[Check] = (),  # type: ignore[assignment]
          ok: bool | None = None) -> int:
    """Write the stage's result and return its exit code (0 when ok).

    ``ok`` defaults to: every judged check held (and there is at least one check).
    """
    if ok is None:
        ok = bool(checks) and all(c.ok is not False for c in checks)
    for c in checks:
        if c.ok is False:
            notes = [*notes, f"failed: {c.name}: {c.measured} (needs {c.threshold})"]
    doc = {"ok": bool(ok), "figures": figures, "checks": [asdict(c) for c in checks], "notes": notes}
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps(doc, default=str), flush=True)
    return 0 if ok else 1
