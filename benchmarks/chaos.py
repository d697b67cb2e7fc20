"""Chaos benchmark: a real deployment under seeded faults; prints what the jobs saw.

    .venv/bin/python benchmarks/chaos.py [--seed 1] [--long] [--window-s S] [--check]

Runs a real redis-server (append-only file), a leader and a standby coordinator on it (bootstrap
secret set), one real ``rollmux sidecar`` per node, and job slots that keep jobs running run after
run: shim slots (two rank processes gated with ``rollmux.phase`` through their nodes' sidecars) and
direct slots (one coordinator client process). During the fault window it injects, seeded:
SIGKILL of the leading coordinator and a restart, a failover to the standby, SIGKILL of a node's
sidecar and a restart, SIGKILL of a job process mid-phase, and a Redis restart. Then it lets the
last runs finish and prints, from the event log: faults injected by kind with the time to recover
(fault -> first phase granted after the faulty part served again, on its nodes where it took nodes
away), phases completed, mutual-exclusion violations (two runs holding one node at once), and lost,
repeated or out-of-order phases per run against the on-policy order.

Default: a ~60 s window (about 90 s in all). ``--long`` or ROLLMUX_CHAOS_LONG=1: a 600 s window with
more slots and nodes. ``--check`` exits 1 on any violation, lost, repeated or out-of-order phase,
phase with no recorded end, unrecovered fault, unfinished slot, fault kind never injected, or fewer phases than
``--min-phases`` (default: one per second of window). Logs go to ``--out`` (a temp dir by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from rollmux.testing.chaos.deployment import Topology
from rollmux.testing.chaos.ledger import table
from rollmux.testing.chaos.scenario import ChaosConfig, ChaosResult, run_chaos

LONG_ENV = "ROLLMUX_CHAOS_LONG"
SHORT = ChaosConfig(window_s=60.0)
LONG = ChaosConfig(window_s=600.0, shim_jobs=4, direct_jobs=2, iterations=10,
                   topology=Topology(rollout_nodes=3, train_nodes=3))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1, help="seeds the fault kinds' order and the pauses")
    ap.add_argument("--long", action="store_true", help=f"the long run (also {LONG_ENV}=1): 600 s of faults")
    ap.add_argument("--window-s", type=float, help="override the fault window, s")
    ap.add_argument("--min-phases", type=int, help="--check fails below this many phases (default: 1 per window s)")
    ap.add_argument("--out", type=Path, help="folder for the logs and the event log (default: a temp dir)")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every check holds")
    return ap.parse_args(argv)


def failures(result: ChaosResult, config: ChaosConfig, min_phases: int) -> list[str]:
    v = result.verdict
    out = []
    if not v.clean:
        out.append(f"{len(v.violations)} mutual-exclusion violations, {v.lost} lost, {v.repeated} repeated, "
                   f"{v.out_of_order} runs out of order, {v.unclosed} phases with no recorded end")
    if result.unfinished:
        out.append(f"slots whose last run did not finish: {', '.join(result.unfinished)}")
    if v.unrecovered:
        out.append("faults not recovered: " + ", ".join(f"{k} {n}" for k, n in sorted(v.unrecovered.items())))
    missing = [k.value for k in config.kinds if not v.faults.get(k.value)]
    if missing:
        out.append(f"fault kinds never injected: {', '.join(missing)}")
    if v.phases_completed < min_phases:
        out.append(f"{v.phases_completed} phases completed, below the {min_phases} required")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    config = LONG if args.long or os.environ.get(LONG_ENV) == "1" else SHORT
    config = replace(config, seed=args.seed, **({"window_s": args.window_s} if args.window_s else {}))
    out = args.out or Path(tempfile.mkdtemp(prefix="rollmux-chaos-"))
    min_phases = args.min_phases if args.min_phases is not None else int(config.window_s)
    print(f"chaos: seed {config.seed}, {config.window_s:g}s fault window, {config.shim_jobs} shim + "
          f"{config.direct_jobs} direct job slots x {config.iterations} iterations per run, "
          f"{config.topology.rollout_nodes}+{config.topology.train_nodes} nodes; logs in {out}", flush=True)
    result = run_chaos(config, out, progress=lambda msg: print(f"  {msg}", flush=True))
    print()
    print(table(result.verdict))
    window = result.window_s
    print(f"fault window {window:.0f}s, whole run {result.wall_s:.0f}s; "
          f"{result.verdict.phases_completed / max(window, 1e-9):.1f} phases per second of fault window "
          f"(the runs after it counted too)")
    for err in result.injector_errors:
        print(f"  fault not injected: {err}")
    if result.unfinished:
        print(f"unfinished slots: {', '.join(result.unfinished)}")
    failed = failures(result, config, min_phases)
    if args.check:
        print("check: " + ("PASS" if not failed else "FAIL: " + "; ".join(failed)))
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
