"""The policy's mechanisms as command-line switches, declared once for every CLI.

Each switchable `PolicyConfig` mechanism gets one ``--no-<flag>`` switch with one help text;
`rollmux simulate`, `rollmux coordinator` and the benchmarks add the ones they offer
(docs/design/policy.md has what each mechanism buys).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, fields

from rollmux.coordinator.policy.api import PolicyConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Mechanism:
    """One mechanism of the policy that a run may switch off."""

    field: str  # the `PolicyConfig` field it sets
    flag: str  # the switch is ``--no-<flag>``
    off: str  # what the policy does with the mechanism off (the switch's help)

    @property
    def dest(self) -> str:
        """The attribute argparse stores the switch under."""
        return "no_" + self.flag.replace("-", "_")


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(field="modes", flag="modes",
              off="every job a disaggregated group member (no co-location on training- or rollout-pool GPUs)"),
    Mechanism(field="learn", flag="learning",
              off="plan with worst-case phase times for a job's whole life (no times learned from measured "
                  "iterations)"),
    Mechanism(field="regroup", flag="regroup",
              off="never relocate a running job between groups (no consolidation on departures or SLO risk)"),
    Mechanism(field="pool_merge", flag="pool-merge",
              off="regrouping never pools two lone jobs' training nodes into one disaggregated group"),
    Mechanism(field="work_aware", flag="work-aware",
              off="the cheapest join in $/h always beats a new group, however much it stretches the group's "
                  "period (no $-per-work check)"),
    Mechanism(field="pool_return", flag="pool-return",
              off="a pool merge's survivor gets no relocation beyond the per-job cap to leave the pooled "
                  "training nodes"),
    Mechanism(field="regroup_on_learn", flag="regroup-on-learn",
              off="look for moves only after arrivals and departures, not when members' phase times become "
                  "learned"),
    Mechanism(field="pooled_joins", flag="pooled-joins",
              off="a group whose training pool is larger than every member needs takes no newcomer"),
    Mechanism(field="pull_moves", flag="pull-moves",
              off="a job alone in its group moves only at its own events (no lone job pulled into a group "
                  "whose plan changed)"),
    Mechanism(field="best_move", flag="best-move",
              off="regrouping takes the first of single move, pair merge, pool merge that pays (not the one "
                  "saving the most)"),
)
"""Every switchable mechanism, in the order `--help` lists them."""

_BY_FIELD = {m.field: m for m in MECHANISMS}
assert set(_BY_FIELD) <= {f.name for f in fields(PolicyConfig)}, "a mechanism names no PolicyConfig field"


def add_mechanism_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                        only: Iterable[str] | None = None) -> None:
    """Add ``--no-<flag>`` for every mechanism (or those whose `PolicyConfig` field is in `only`)."""
    for m in MECHANISMS if only is None else (_BY_FIELD[f] for f in only):
        parser.add_argument(f"--no-{m.flag}", dest=m.dest, action="store_true", help=m.off)


def mechanisms_on(args: argparse.Namespace) -> dict[str, bool]:
    """`PolicyConfig` field -> on, for every mechanism switch `args` has (a switch not offered is absent)."""
    return {m.field: not getattr(args, m.dest) for m in MECHANISMS if hasattr(args, m.dest)}


__all__ = ["MECHANISMS", "Mechanism", "add_mechanism_flags", "mechanisms_on"]
