"""What every stage script shares: its command line and how it writes its result."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parse(description: str, argv: list[str] | None = None, **extra: Any) -> argparse.Namespace:
    """``--out FILE`` (the result), ``--cpu``, ``--small``, plus ``extra`` flags (name -> default)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, type=Path, help="where the stage writes its JSON result")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and the per-PID stand-in instead of NVML")
    p.add_argument("--small", action="store_true", help="scaled-down sizes")
    for name, default in extra.items():
        p.add_argument(f"--{name.replace('_', '-')}", default=default, type=type(default) if default is not None else str)
    return p.parse_args(argv)


def write(path: Path, *, ok: bool, figures: dict[str, Any], notes: list[str]) -> int:
    """Write the stage's result and return its exit code (0 when ok)."""
    path.write_text(json.dumps({"ok": bool(ok), "figures": figures, "notes": notes}, indent=2, default=str))
    print(json.dumps({"ok": bool(ok), "figures": figures, "notes": notes}, default=str), flush=True)
    return 0 if ok else 1
