"""``rollmux demo``: pick one demo (a flag per demo; the first is the default) and run it.

Each demo is one module exposing ``HELP`` (one line), ``configure(group)`` (its own options, added
to an argument group named after it) and ``run(args) -> int``. Adding a demo is one module and one
line in :data:`DEMOS`; ``rollmux demo --<name>`` then runs it. Options shared by every demo
(``--out``, ``--no-live``) are added here; ``args.out`` reaches the demo as an absolute path, so a
demo's child processes may run in any directory.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

# demo name -> module; the first one runs when no demo flag is given
DEMOS: dict[str, str] = {
    "tiny": "rollmux.demo.tiny",
}

HELP = "Run a RollMux demo on this machine (default: three tiny GRPO jobs on two CPU cores, no GPU)."


def _modules() -> dict[str, ModuleType]:
    out = {}
    for name, module_name in DEMOS.items():
        try:
            out[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # demo not built into this install
            raise
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    modules = _modules()
    default = next(iter(DEMOS))
    parser.add_argument("--out", default="rollmux-demo",
                        help="folder for logs, summary.json and gantt.png (relative to the current directory)")
    parser.add_argument("--no-live", action="store_true", help="no live view (logs only)")
    which = parser.add_mutually_exclusive_group()
    for name, module in modules.items():
        which.add_argument(f"--{name}", dest="demo", action="store_const", const=name, default=argparse.SUPPRESS,
                           help=module.HELP + (" (the default)" if name == default else ""))
        module.configure(parser.add_argument_group(f"{name} demo"))


def run(args: argparse.Namespace) -> int:
    args.out = Path(args.out).expanduser().resolve()
    module = importlib.import_module(DEMOS[getattr(args, "demo", next(iter(DEMOS)))])
    return int(module.run(args))
