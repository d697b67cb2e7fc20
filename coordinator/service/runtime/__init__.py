"""The coordinator's runtime state and every transition on it, with no I/O.

`Runtime` holds the cluster as the coordinator sees it (nodes, jobs, the policy's groups,
per-node round-robin turns, permits and their leases) and changes it only through its methods. Each method
validates first and raises a `ServiceError` before touching anything, then mutates, marks the
records it changed dirty and queues `Notice`s. The shell (`server.py`) takes the dirty records and
commits them to the store in one atomic batch before it answers, and delivers the notices to node
streams and waiting jobs. Time is injected (`clock`, monotonic seconds) so tests drive TTLs.

`Runtime` is a facade over composed parts, each owning its own fields (the only part that writes
them) and handed the parts it calls in its constructor; no part calls one above it:

| part (module)                     | owns                                                   | calls                                   |
|-----------------------------------|--------------------------------------------------------|-----------------------------------------|
| `RuntimeState` (`state`)          | `meta`, change set, notices; holds the shared records  | nothing                                 |
| `NodeLiveness` (`nodes`)          | node records and transitions, `connected`              | nothing                                 |
| `PhaseLearning` (`learning`)      | `learner`, `learned`, queued learning events, profiles | nothing                                 |
| `GrantQueues` (`grants`)          | `served` (round-robin turns); asks `policy.grants`     | liveness                                |
| `Leases` (`leases`)               | permit records and transitions, `holder`, `freed_at`   | liveness, queues, learning              |
| `LongTailMigration` (`migration`) | nothing (decides; leases apply)                        | leases, queues                          |
| `Directives` (`directives`)       | relocation directive records                           | nothing                                 |
| `Admission` (`admission`)         | job records, group membership, stored groups           | leases, queues, learning, directives    |
| `Relocations` (`relocation`)      | jobs' `moves`                                          | directives, learning, admission, leases |
| `stored`                          | the stored form: records by key, and parsing them back | `admission.group_record`                |
| `Runtime` (`facade`)              | nothing: wires the parts, sequences events across them, invariants | every part              |
| `views`                           | nothing: job status, the cluster view, a node's events, wait reasons (read only) | the parts' fields |

Readers take the parts' fields directly (`rt.state.jobs`, `rt.leases.holder`); the servicer answers
through `views`. `tests/coordinator/service/test_runtime_parts.py` holds this order (no module imports one
listed after it) and that no part subclasses another; `test_parts.py` tests each part on its own.

Events between parts are explicit calls: a node that became READY again (`NodeLiveness.connect`,
`heard` return True) gets grants and admissions from `Runtime`; a departure (`remove_job`) is told to
`Relocations.departed` by `Runtime`; a learning event is queued in `PhaseLearning` and taken by
`Relocations.plan_deferred`; deadlines and expiry are the three parts' (liveness, leases, directives)
in that order.

Runtime semantics (DESIGN.md, Intra-group scheduler):
- A job's phase waits for every node it needs: Rollout for the job's pinned rollout nodes, Train and
  Sync for the group's training nodes. A job asks for its next phase the moment its previous one is
  released. On each node the group's jobs take turns in member order, once per meta-iteration
  (`policy.grants.grant_step`, the same step the simulator runs): the schedule the SLO check
  assumes. Train keeps the training turn for its Sync, so nothing interleaves with them.
- Every node's turn order is the group's one member order. Turns on different nodes can still get
  out of step (a crash between two stored writes, joins and departures mid meta-iteration), and two
  waiting jobs can then hold each other's turn; the grant step breaks such a cycle by passing over
  one turn (`policy.grants.deadlock_edge`), so a group never stalls on turns alone.
- A grant holds every needed node with a lease (cluster-wide increasing epoch + TTL). At most one
  permit holds a node (`holder`), the safety invariant `check_invariants` asserts.
"""

from __future__ import annotations

from rollmux.coordinator.service.runtime.facade import Runtime, resolved_spec
from rollmux.coordinator.service.runtime.leases import ReleaseResult
from rollmux.coordinator.service.runtime.state import Clock, Notice, NoticeKind

__all__ = ["Clock", "Notice", "NoticeKind", "ReleaseResult", "Runtime", "resolved_spec"]
