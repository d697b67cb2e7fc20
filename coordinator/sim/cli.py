"""`rollmux simulate`: replay a trace through RollMux and the paper's baselines side by side."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.flags import add_mechanism_flags, mechanisms_on
from rollmux.coordinator.sim.api import ProgressFn, SimError, TraceJob
from rollmux.coordinator.sim.engine import build_context, simulate
from rollmux.coordinator.sim.report import print_summaries
from rollmux.coordinator.sim.runtime import RuntimeConfig
from rollmux.coordinator.sim.strategies import ALL_POLICIES, DEFAULT_POLICIES
from rollmux.coordinator.sim.trace import read_trace, write_trace
from rollmux.coordinator.sim.workload import SloSpec, Workload, generate
from rollmux.core.errors import RollMuxError
from rollmux.core.model import ClusterSpec

HELP = "Replay a job trace through RollMux and the baselines (solo-d, colocate, gavel+, random, most-idle, opt)."

EPILOG = """\
Trace CSV columns: job_id,arrival_s,iterations,t_roll_s,t_train_s,n_rollout_gpus,n_train_gpus,slo,
rollout_state_gb,train_state_gb (optional: model,max_tokens,turns). Times are worst-case solo
phase seconds, state is per 8-GPU node. Without --trace a workload is generated: Philly arrivals
(Jeon et al., ATC'19) and the paper's Table 6 phase times.

Examples:
  rollmux simulate                                   # 300-job mixed trace, all policies but opt
  rollmux simulate --workload rollout-heavy --slo 1.2 --json out.json --plots figs/
  rollmux simulate --jobs 8 --policies rollmux,opt   # compare with the offline optimum
  rollmux simulate --no-migration                    # switch off long-tail migration
  rollmux simulate --no-modes --no-learning --no-regroup   # the paper's Algorithm 1 policy
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    src = parser.add_argument_group("trace")
    src.add_argument("--trace", type=Path, help="replay this CSV instead of generating a workload")
    src.add_argument("--workload", choices=[w.value for w in Workload], default=Workload.MIXED.value,
                     help="generated workload profile (paper Table 6) [default: mixed]")
    src.add_argument("--jobs", type=int, default=300, help="jobs to generate [default: 300, about 580 h]")
    src.add_argument("--seed", type=int, default=0, help="seed of the generator, runtime draws and Random [default: 0]")
    src.add_argument("--slo", default="U(1,2)", help="SLO of generated jobs: a factor like 1.2, or U(low,high) "
                                                    "drawn per job [default: U(1,2)]")
    src.add_argument("--emit-trace", type=Path, metavar="FILE", help="also write the (generated) trace as CSV")
    pol = parser.add_argument_group("policies")
    pol.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                     help=f"comma-separated, from {', '.join(ALL_POLICIES)} [default: all but opt]")
    pol.add_argument("--max-group-size", type=int, default=5, help="most jobs per group [default: 5]")
    add_policy_switches(pol)
    rt = parser.add_argument_group("runtime model (each switch shows one mechanism's effect)")
    rt.add_argument("--no-migration", action="store_true", help="no long-tail migration")
    rt.add_argument("--cold-start", action="store_true", help="every context switch is a cold start (paper Fig. 4)")
    rt.add_argument("--flat-sync", action="store_true", help="flat weight sync over the cross-cluster link")
    rt.add_argument("--worst-case", action="store_true", help="every phase takes its worst-case time (no draws)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write all metrics as JSON")
    out.add_argument("--plots", type=Path, metavar="DIR", help="write cost, GPU and Gantt PNGs")
    out.add_argument("--quiet", action="store_true", help="no progress bar")


def add_policy_switches(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """RollMux's policy mechanisms, each switched off by one flag (docs/design/policy.md has what each buys)."""
    add_mechanism_flags(parser)
    parser.add_argument("--max-moves", type=int, default=PolicyConfig().max_moves_per_job, metavar="N",
                        help="RollMux: relocations one job may take over its life [default: %(default)s]")
    parser.add_argument("--learn-min-samples", type=int, default=PolicyConfig().learn_min_samples, metavar="N",
                        help="RollMux: measured iterations before a job is planned with its learned times "
                             "[default: %(default)s]")
    parser.add_argument("--coexec-margin", type=float, default=PolicyConfig().coexec_margin, metavar="M",
                        help="RollMux: a join must keep every member's fixed-time period within budget / (1 + M) "
                             "(0: up to the budget) [default: %(default)s]")
    parser.add_argument("--coexec-margin-big", type=float, default=PolicyConfig().coexec_margin_big, metavar="M",
                        help="RollMux: the margin for a join that makes a group of 4 or more members "
                             "(set it to --coexec-margin for one margin) [default: %(default)s]")
    parser.add_argument("--train-scaling", action="store_true",
                        help="RollMux: a job may join a group's rollout nodes bringing its own training nodes "
                             "(off by default: measured costlier, docs/design/policy.md)")


def policy_config_from(args: argparse.Namespace) -> PolicyConfig:
    """The simulator's policy (`PolicyConfig.simulator`): every mechanism on unless switched off."""
    base = PolicyConfig()
    return PolicyConfig.simulator(max_group_size=getattr(args, "max_group_size", 5),
                                  coexec_margin=getattr(args, "coexec_margin", base.coexec_margin),
                                  coexec_margin_big=getattr(args, "coexec_margin_big", base.coexec_margin_big),
                                  max_moves_per_job=getattr(args, "max_moves", base.max_moves_per_job),
                                  learn_min_samples=getattr(args, "learn_min_samples", base.learn_min_samples),
                                  train_scaling=getattr(args, "train_scaling", False), **mechanisms_on(args))


def _trace(args: argparse.Namespace) -> tuple[list[TraceJob], str]:
    if args.trace is not None:
        return read_trace(args.trace), str(args.trace)
    slo = SloSpec.parse(args.slo)
    jobs = generate(args.workload, args.jobs, args.seed, slo)
    return jobs, f"{args.workload}, {args.jobs} jobs, SLO {slo}, seed {args.seed}"


@contextmanager
def _progress_bars(enabled: bool, total: int, console: Console) -> Iterator[object]:
    if not enabled:
        yield None
        return
    with Progress(TextColumn("[bold]{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs placed"), TimeElapsedColumn(), console=console, transient=False) as bar:

        def factory(name: str) -> ProgressFn:
            task = bar.add_task(name, total=total)
            return lambda n: bar.advance(task, n)

        yield factory


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=False)
    try:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in policies if p not in ALL_POLICIES]
        if unknown:
            raise SimError(f"--policies has unknown name(s) {', '.join(unknown)}: expected some of {', '.join(ALL_POLICIES)}")
        if args.max_group_size < 1:
            raise SimError(f"--max-group-size={args.max_group_size} is invalid: expected an integer >= 1")
        trace, label = _trace(args)
        if args.emit_trace:
            write_trace(trace, args.emit_trace)
            console.print(f"wrote trace to {args.emit_trace}")
        runtime = RuntimeConfig(stochastic=not args.worst_case, migration=not args.no_migration,
                                warm_start=not args.cold_start, two_stage_sync=not args.flat_sync)
        ctx = build_context(trace, ClusterSpec(), runtime, args.max_group_size, args.seed,
                            policy_config=policy_config_from(args))
        span_h = (max(j.arrival_s for j in trace) - min(j.arrival_s for j in trace)) / 3600
        with _progress_bars(not args.quiet, len(trace), console) as factory:
            result = simulate(trace, policies, ctx=ctx, progress=factory)  # type: ignore[arg-type]
    except RollMuxError as exc:
        print(f"error: {exc}", file=sys.stderr)  # plain: rich would re-wrap file:line messages
        return 2
    summaries = list(result.summaries.values())
    print_summaries(summaries, f"{label}: {len(trace)} jobs arriving over {span_h:.0f} h", console)
    if args.json:
        from rollmux.coordinator.sim.metrics import to_json

        meta = {"trace": label, "jobs": len(trace), "arrival_span_h": span_h,
                "runtime": {"stochastic": runtime.stochastic, "migration": runtime.migration,
                            "warm_start": runtime.warm_start, "two_stage_sync": runtime.two_stage_sync},
                "max_group_size": args.max_group_size, "seed": args.seed}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(summaries, meta), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if args.plots:
        from rollmux.coordinator.sim.plots import write_plots

        for p in write_plots(result.runs, args.plots):
            console.print(f"wrote {p}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollmux simulate", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
