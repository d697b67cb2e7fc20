"""Long-tail migration: a tail-bound rollout gives up nodes other jobs wait for.

Owns no field: it decides (`ServiceConfig.migration_rule`) when a rollout consolidates and onto which
nodes; `Leases.consolidate` applies that to the lease. Calls Leases and GrantQueues (who waits).
"""

from __future__ import annotations

from rollmux.coordinator.service.runtime.api import FailedPreconditionError, InvalidArgumentError
from rollmux.coordinator.service.runtime.grants import GrantQueues
from rollmux.coordinator.service.runtime.leases import Leases
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.core.model import Migration, Phase


class LongTailMigration:
    """Consolidating a rollout onto fewer nodes once it is tail-bound."""

    def __init__(self, state: RuntimeState, leases: Leases, queues: GrantQueues) -> None:
        self.state = state
        self.leases = leases
        self.queues = queues

    def report_progress(self, name: str, epoch: int, finished: int, total: int) -> Migration | None:
        """Record rollout progress; once tail-bound, consolidate onto a few nodes (long-tail migration)."""
        if total <= 0 or finished < 0 or finished > total:
            raise InvalidArgumentError(f"progress finished={finished} total={total} is invalid: "
                                       "expected 0 <= finished <= total and total > 0")
        permit = self.leases.granted(name, epoch, "report progress for")
        if permit.phase is not Phase.ROLLOUT:
            raise FailedPreconditionError(f"job {name!r} reported rollout progress while holding "
                                          f"{permit.phase.value}({permit.iteration}): report it during rollout")
        self.leases.extend(permit)
        done = finished / total
        rule = self.state.config.migration_rule
        if permit.migrated or not rule.tail_bound(finished, total) or len(permit.nodes) < 2:
            return None
        waited = [n for n in permit.nodes if any(j != name for j in self.queues.waiting(n))]
        plan = rule.plan(permit.nodes, waited)  # None: nobody would use the freed nodes
        if plan is None:
            return None
        keep, release = plan
        self.leases.consolidate(permit, keep=keep, release=release)
        decision = Migration(job=name, epoch=epoch, keep_nodes=keep, release_nodes=release)
        self.state.notify(Notice(kind=NoticeKind.MIGRATE, job=name, nodes=keep + release, epoch=epoch,
                                 keep_nodes=keep, release_nodes=release, reason=f"rollout {done:.0%} done"))
        self.leases.grant_waiting(release)
        return decision
