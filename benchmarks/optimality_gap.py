"""RollMux's cost over the offline optimum on random small instances: arrival placement, the live
coordinator's outcome, and batch planning, side by side.

Each instance is `--jobs` jobs of the paper's mixed Table 6 workload (SLO ~ U(1,2)), all present at
once (pending together). RollMux figures, each $/h over the optimum's (`optimum.optimal_partition`,
which knows every job and plans on fixed times) for the same problem: the live figures over the
optimum whose groups keep the co-execution margins the live policy keeps (`coexec_margin`: a join
leaves every member 2% below its SLO budget, 4% from four members; a member whose SLO is within 2% of
its solo time shares no group, live or optimal), batch over the optimum without margins (its planner
drops them, `regroup.place_batch`). Both optima are printed per instance:

- **arrival**: the live admission alone: the jobs admitted in arrival order, each knowing the jobs
  pending behind it (`admission.place_pending`, the call `runtime.admission` makes), no regrouping;
- **live**: what the live coordinator ends with: that admission, then the regroup passes it runs on
  learning events and departures (`regroup.plan_moves` per member of each group, one move at a time,
  each job at most `regroup.move_cap` moves, weighed over `ServiceConfig.relocation_horizon_s` with
  its relocation downtime charged, as `runtime.relocation` does) until no move pays;
- **batch**: `regroup.place_batch` planning all of them at once (no live path runs it);
- **one-by-one** (shown, not judged): each job placed as if it arrived alone (`RollMuxPolicy.place`);
- **one-at-a-time live** (judged, in the summary): the jobs arrive one at a time, each followed by its
  regroup moves and multi-move plan (`replan.plan_regroup`), then regroup passes until nothing pays.

Every figure uses the live coordinator's policy knobs (`runtime.state.live_policy_config`), with
deployment modes on (`--no-modes`: off, the service's default) and the optimum priced with them.

    python benchmarks/optimality_gap.py --instances 50 --jobs 8 [--check] [--check-arrival]

--check exits non-zero unless the live figure has mean <= 1.06x and max <= 1.15x, and the one-at-a-time
live figure mean <= 1.06x and max <= 1.12x (the paper: 1.01-1.12x, mean 1.06x); --check-arrival also
requires arrival mean <= 1.10x.

Why `--check` judges the live figure over the margin-aware optimum: the margins are a deliberate cost,
not a gap. A group planned at exactly its members' budgets on fixed times runs 1-3% over them on real,
varying phase times (docs/design/policy.md, co-execution margin); the margin-free optimum packs such
groups, which no coordinator that keeps its realised SLOs may run. Its figure (info) is the price of
the margins plus the gap; where it is large, the instance has a group the margins forbid, and no pure
policy change closes that without giving up the realised SLO.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _policy_jobs import mixed_jobs  # noqa: E402

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy  # noqa: E402
from rollmux.coordinator.policy.admission import place_pending  # noqa: E402
from rollmux.coordinator.policy.optimum import optimal_partition  # noqa: E402
from rollmux.coordinator.policy.regroup import apply_moves, move_cap, place_batch, plan_moves  # noqa: E402
from rollmux.coordinator.policy.replan import apply_plan, plan_regroup  # noqa: E402
from rollmux.coordinator.service.runtime.api import ServiceConfig  # noqa: E402
from rollmux.coordinator.service.runtime.state import live_policy_config  # noqa: E402
from rollmux.core.model import JobSpec  # noqa: E402

TARGET_LIVE_MEAN, TARGET_LIVE_MAX = 1.06, 1.15
TARGET_ALONE_MEAN, TARGET_ALONE_MAX = 1.06, 1.12
TARGET_ARRIVAL_MEAN = 1.10
PAPER = "paper: 1.01-1.12x, mean 1.06x"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    usd_per_h: float
    moves: int = 0
    downtime_usd: float = 0.0  # $ the relocated jobs' downtime costs (their own groups' $/h meanwhile)


def arrival(jobs: list[JobSpec], config: PolicyConfig, pending: bool = True) -> tuple[ClusterState, RollMuxPolicy]:
    """The jobs admitted in arrival order: with `pending`, each knowing the jobs that wait behind it
    (`admission.place_pending`, what the live admission calls); without, one at a time."""
    state, policy = ClusterState(), RollMuxPolicy(config)
    for i, job in enumerate(jobs):
        state.apply(job, place_pending(policy, job, state, jobs[i + 1:] if pending else ()))
    return state, policy


def live(jobs: list[JobSpec], config: PolicyConfig, horizon_s: float, pending: bool = True) -> Outcome:
    """The live coordinator's outcome. With `pending`: the pending jobs admitted together (lookahead),
    then regroup passes until no move pays. Without: the jobs arrive one at a time; after each
    arrival its single moves and merges, then its multi-move plan (`replan.plan_regroup`, the
    arrival's own move free: it has not started), then regroup passes over everyone until no move
    and no multi-move plan pays. Every move weighed over `horizon_s` with its downtime charged, each
    job at most `regroup.move_cap` moves (a multi-move plan counts one per job it moves)."""
    state, policy = (arrival(jobs, config, pending) if pending else (ClusterState(), RollMuxPolicy(config)))
    moved: dict[str, int] = {}
    n_moves, downtime_usd = 0, 0.0

    def remaining(name: str) -> float:  # runtime.relocation._remaining_s at planned speed
        return horizon_s if moved.get(name, 0) < move_cap(state, config, name) else 0.0

    def settle(multi: bool, fresh: tuple[str, ...] = ()) -> None:
        nonlocal n_moves, downtime_usd
        while True:
            names = [n for g in list(state.groups.values()) for n in g.members]
            step = next((m for n in names if (m := plan_moves(state, policy, [n], remaining))), None)
            if not step and multi:
                touched = [state.job_group[n] for n in fresh] or list(state.groups)
                plan = plan_regroup(state, policy, touched, remaining, fresh=fresh)
                step = list(plan.moves) if plan is not None else None
                if plan is not None:
                    downtime_usd += sum(state.groups[m.from_group].usd_per_h * m.downtime_s / 3600.0 for m in step)
                    apply_plan(state, plan)
                    for m in step:
                        moved[m.job] = moved.get(m.job, 0) + int(m.job not in fresh)
                    n_moves += sum(m.job not in fresh for m in step)
                    fresh = ()
                    continue
            if not step:
                return
            downtime_usd += sum(state.groups[m.from_group].usd_per_h * m.downtime_s / 3600.0 for m in step)
            apply_moves(state, step)
            for m in step:
                moved[m.job] = moved.get(m.job, 0) + 1
            n_moves += len(step)

    if not pending:
        for job in jobs:
            state.apply(job, policy.place(job, state))
            settle(True, (job.name,))
    settle(not pending)
    return Outcome(usd_per_h=state.usd_per_h, moves=n_moves, downtime_usd=downtime_usd)


def batch(jobs: list[JobSpec], config: PolicyConfig) -> Outcome:
    state = ClusterState()
    _, moves = place_batch(jobs, state, RollMuxPolicy(config))
    return Outcome(usd_per_h=state.usd_per_h, moves=len(moves))


def summary(name: str, ratios: list[float]) -> str:
    at_opt = sum(r <= 1 + 1e-9 for r in ratios)
    return (f"{name:<10} mean {statistics.mean(ratios):.3f}x  max {max(ratios):.3f}x  "
            f"optimal in {at_opt}/{len(ratios)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=50, help="random instances")
    ap.add_argument("--jobs", type=int, default=8, help="jobs per instance (<= 14)")
    ap.add_argument("--sizes", default="SML", help="size classes to draw from (S, M, L)")
    ap.add_argument("--max-group-size", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-modes", action="store_true", help="every job disaggregated (the service's default)")
    ap.add_argument("--algorithm1", action="store_true",
                    help="prune saturated groups as the paper's Algorithm 1 does (default: pack them when SLOs allow)")
    ap.add_argument("--quiet", action="store_true", help="print the summary only")
    ap.add_argument("--check", action="store_true",
                    help=f"exit non-zero unless live mean <= {TARGET_LIVE_MEAN}x and max <= {TARGET_LIVE_MAX}x")
    ap.add_argument("--check-arrival", action="store_true",
                    help=f"with --check: also arrival placement alone mean <= {TARGET_ARRIVAL_MEAN}x")
    args = ap.parse_args(argv)
    service = ServiceConfig(policy=PolicyConfig.live(modes=not args.no_modes))
    config = replace(live_policy_config(service, max_group_size=args.max_group_size), fill_saturated=not args.algorithm1)
    print(f"policy config (live coordinator's): {config}")
    print(f"{'instance':>8} {'opt $/h':>9} {'opt, no margin':>14} {'one-by-one':>10} {'arrival':>8} {'live':>8} {'moves':>5} {'downtime $':>10} "
          f"{'batch':>8} {'1-at-a-time':>11}")
    ratios: dict[str, list[float]] = {"one-by-one": [], "arrival": [], "live": [], "batch": []}
    live_bare: list[float] = []  # the live figure over the optimum without margins (shown, not judged)
    live_alone: list[float] = []  # jobs arriving one at a time, then the regroup passes (shown, not judged)
    t_opt = 0.0
    for i in range(args.instances):
        jobs = mixed_jobs(args.jobs, args.seed * 100_003 + i, sizes=args.sizes)
        t0 = time.perf_counter()
        opt = optimal_partition(jobs, None, config, margins=True).usd_per_h
        t_opt += time.perf_counter() - t0
        bare = optimal_partition(jobs, None, config).usd_per_h
        runs = {"one-by-one": Outcome(usd_per_h=arrival(jobs, config, pending=False)[0].usd_per_h),
                "arrival": Outcome(usd_per_h=arrival(jobs, config)[0].usd_per_h),
                "live": live(jobs, config, service.relocation_horizon_s), "batch": batch(jobs, config)}
        for k, run in runs.items():
            ratios[k].append(run.usd_per_h / (bare if k == "batch" else opt))
        live_bare.append(runs["live"].usd_per_h / bare)
        alone = live(jobs, config, service.relocation_horizon_s, pending=False)
        live_alone.append(alone.usd_per_h / opt)
        if not args.quiet:
            print(f"{i:>8} {opt:>9.2f} {bare:>14.2f} {ratios['one-by-one'][-1]:>9.3f}x {ratios['arrival'][-1]:>7.3f}x "
                  f"{ratios['live'][-1]:>7.3f}x {runs['live'].moves:>5} {runs['live'].downtime_usd:>10.2f} "
                  f"{ratios['batch'][-1]:>7.3f}x {live_alone[-1]:>10.3f}x", flush=True)
    print(f"RollMux $/h / optimum over {args.instances} instances of {args.jobs} jobs ({PAPER}); "
          f"optimum solve time {t_opt / max(args.instances, 1) * 1e3:.0f} ms/instance")
    for k in ratios:
        print("  " + summary(k, ratios[k]))
    print("  (info) " + summary("live", live_bare) + " over the optimum without co-execution margins")
    print("  " + summary("one-at-a-time live", live_alone) + " (jobs arriving one at a time, no lookahead; moves and "
          "multi-move plans after each arrival and after the last)")
    live_mean, live_max = statistics.mean(ratios["live"]), max(ratios["live"])
    arr_mean = statistics.mean(ratios["arrival"])
    targets = [(f"live mean {live_mean:.3f}x <= {TARGET_LIVE_MEAN}x", live_mean <= TARGET_LIVE_MEAN + 1e-12),
               (f"live max {live_max:.3f}x <= {TARGET_LIVE_MAX}x", live_max <= TARGET_LIVE_MAX + 1e-12),
               (f"one-at-a-time live mean {statistics.mean(live_alone):.3f}x <= {TARGET_ALONE_MEAN}x",
                statistics.mean(live_alone) <= TARGET_ALONE_MEAN + 1e-12),
               (f"one-at-a-time live max {max(live_alone):.3f}x <= {TARGET_ALONE_MAX}x",
                max(live_alone) <= TARGET_ALONE_MAX + 1e-12)]
    if args.check_arrival:
        targets.append((f"arrival mean {arr_mean:.3f}x <= {TARGET_ARRIVAL_MEAN}x", arr_mean <= TARGET_ARRIVAL_MEAN + 1e-12))
    for text, ok in targets:
        print(f"  {'MET   ' if ok else 'MISSED'} {text}")
    return 0 if (all(ok for _, ok in targets) or not args.check) else 1


if __name__ == "__main__":
    sys.exit(main())
