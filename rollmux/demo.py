"""`rollmux demo`: three tiny GRPO jobs multiplexed on this machine's CPUs (no GPU, no service).

Thin command module; the demo lives in ``rollmux.sidecar.demo_run``. Torch is imported only by the
job processes it starts.
"""

from __future__ import annotations

import argparse

HELP = ("Run three tiny GRPO jobs solo, then multiplexed through an embedded coordinator and two "
        "sidecars (one CPU core per pool); live view, summary and a Gantt PNG.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="rollmux-demo", help="folder for logs, summary.json and gantt.png")
    parser.add_argument("--seconds", type=float, default=50.0, help="target length of the multiplexed part")
    parser.add_argument("--solo-iterations", type=int, default=4, help="iterations of each solo measurement")
    parser.add_argument("--rollout-cpu", type=int, default=0, help="CPU core of the rollout pool")
    parser.add_argument("--train-cpu", type=int, default=1, help="CPU core of the training pool")
    parser.add_argument("--no-live", action="store_true", help="no live view (logs only)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rollmux.sidecar.api import SidecarError
    from rollmux.sidecar.demo_run import DemoConfig, run_demo
    from rollmux.sidecar.launch import Pools

    cfg = DemoConfig(out=Path(args.out), mux_seconds=args.seconds, solo_iterations=args.solo_iterations,
                     live=not args.no_live, pools=Pools(rollout_cpu=args.rollout_cpu, train_cpu=args.train_cpu))
    try:
        summary = run_demo(cfg)
    except KeyboardInterrupt:
        print("rollmux demo: interrupted; all child processes were stopped")
        return 130
    except SidecarError as exc:
        print(f"rollmux demo: {exc}")
        return 1
    return 0 if summary.overlaps == 0 and summary.order_problems == 0 else 1
