"""Long-tail migration: a tail-bound rollout gives up nodes other jobs wait for."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollmux.coordinator.service.api import FailedPreconditionError, InvalidArgumentError
from rollmux.coordinator.service.runtime.leases import Leases
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind
from rollmux.model import Phase


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationDecision:
    job: str
    epoch: int
    keep_nodes: tuple[str, ...]
    release_nodes: tuple[str, ...]



class Migration(Leases):
    """Consolidating a rollout onto fewer nodes once it is tail-bound."""

    def report_progress(self, name: str, epoch: int, finished: int, total: int) -> MigrationDecision | None:
        """Record rollout progress; once tail-bound, consolidate onto a few nodes (long-tail migration)."""
        if total <= 0 or finished < 0 or finished > total:
            raise InvalidArgumentError(f"progress finished={finished} total={total} is invalid: "
                                       "expected 0 <= finished <= total and total > 0")
        permit = self._granted(name, epoch, "report progress for")
        if permit.phase is not Phase.ROLLOUT:
            raise FailedPreconditionError(f"job {name!r} reported rollout progress while holding "
                                          f"{permit.phase.value}({permit.iteration}): report it during rollout")
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        done = finished / total
        if permit.migrated or done < self.config.migration_threshold or len(permit.nodes) < 2:
            return None
        waited = [n for n in permit.nodes if self.queues.get(n)]
        if not waited:
            return None  # nobody would use the freed nodes: keep running undisturbed
        keep_n = min(len(permit.nodes) - 1, max(1, math.ceil(len(permit.nodes) * (1.0 - done))))
        order = [n for n in permit.nodes if n not in waited] + waited
        keep, release = tuple(sorted(order[:keep_n])), tuple(sorted(order[keep_n:]))
        permit.nodes, permit.migrated = keep, True
        self._touch(f"permit/{name}", permit)
        for n in release:
            self._free_node(n)
        decision = MigrationDecision(job=name, epoch=epoch, keep_nodes=keep, release_nodes=release)
        self._notify(Notice(kind=NoticeKind.MIGRATE, job=name, nodes=keep + release, epoch=epoch,
                            keep_nodes=keep, release_nodes=release, reason=f"rollout {done:.0%} done"))
        self._pump(release)
        return decision

