"""The `rollmux` command line: one subcommand per module, imported only when used.

Each command module exposes ``HELP`` (one line), ``configure(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module implementing it (kept in one place so `rollmux --help` lists them all)
COMMANDS: dict[str, str] = {
    "place": "rollmux.coordinator.place_cli",
    "simulate": "rollmux.coordinator.sim.cli",
    "coordinator": "rollmux.coordinator.service.cli",
    "status": "rollmux.coordinator.service.status_cli",
    "sidecar": "rollmux.sidecar.cli",
    "scheduler": "rollmux.k8s.cli",
    "demo": "rollmux.demo.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollmux",
        description="RollMux: multiplex synchronous RL post-training jobs over rollout and training GPU pools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # command not built into this install
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
