"""The `rollmux` command line: one subcommand per module, imported only when used.

Each command module exposes ``HELP`` (one line, repeated in :data:`COMMANDS` so that listing the
commands imports none of them), ``configure(parser)`` and ``run(args) -> int``. Running a command
imports its module alone: ``rollmux sidecar`` works on a GPU machine that lacks what the simulator
or the demo needs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module implementing it, its HELP); kept in one place so `rollmux --help` lists them all
COMMANDS: dict[str, tuple[str, str]] = {
    "place": ("rollmux.coordinator.place_cli",
              "place jobs into co-execution groups with the RollMux policy and explain each decision"),
    "simulate": ("rollmux.coordinator.sim.cli",
                 "Replay a job trace through RollMux and the baselines (solo-d, colocate, gavel+, random, most-idle, "
                 "opt)."),
    "coordinator": ("rollmux.coordinator.service.cli",
                    "Run the coordinator service (gRPC API rollmux.v1, Redis or embedded state, probes, metrics)."),
    "status": ("rollmux.coordinator.service.status_cli",
               "Show the coordinator's groups, jobs (state, group, deployment mode, next phase, lease), per-node queues "
               "and leases."),
    "sidecar": ("rollmux.sidecar.cli",
                "Run a node's sidecar: register the node, hold its coordinator stream, serve local ranks on a socket."),
    "scheduler": ("rollmux.k8s.cli",
                  "Run the RollMux Kubernetes scheduler: bind opted-in job pods to the nodes the coordinator places "
                  "them on."),
    "demo": ("rollmux.demo.cli",
             "Run a RollMux demo on this machine (default: three tiny GRPO jobs on two CPU cores, no GPU)."),
}


class MissingDependencyError(ImportError):
    """A command's module needs a package this install lacks (the message names it and the command)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that subcommand's module is imported and configured.

    Without ``command`` every module is imported (the full reference of every flag); a module whose
    third-party dependency is missing is then listed as unavailable instead of failing the listing.

    Raises:
        MissingDependencyError: ``command``'s module needs a package that is not installed.
    """
    parser = argparse.ArgumentParser(
        prog="rollmux",
        description="RollMux: multiplex synchronous RL post-training jobs over rollout and training GPU pools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text, description=help_text)  # listed, never run in this parse
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # command not built into this install
            if command is not None:
                raise MissingDependencyError(f"rollmux {name}: needs the Python module {exc.name!r}, which is not "
                                             "installed (pip install rollmux installs it)") from exc
            sub.add_parser(name, help=f"{help_text} [unavailable here: no module {exc.name!r}]")
            continue
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        parser = build_parser(command)
    except MissingDependencyError as exc:
        print(exc, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
