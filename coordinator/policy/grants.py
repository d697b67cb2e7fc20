"""The grant step: which waiting phases get their nodes now. Pure; the live service and the simulator call it.

The intra-group schedule (`intra_group`) is round-robin meta-iterations: on every node, the jobs that
use it take turns in the group's member order, each once per meta-iteration. The SLO check
(`intra_group.cycle_time`) and the simulator assume exactly that order, so the live coordinator
grants through this step too: a phase gets its nodes only when it is its job's turn on every one of
them and all of them are free.

Interface (plain data in, plain data out; node and job ids are strings):

    step = grant_step(rings, holders, requests, usable=..., skip=...)

- ``rings``: node -> `Ring`, the round-robin order of the jobs that use the node (the group's member
  order restricted to them) and whose turn it is. `group_rings` builds them for a `GroupState` from
  the job each node served last (a turn follows the last served job, so a job that joins the group
  takes its first turn at the end of the current meta-iteration).
- ``holders``: node -> job holding it now (a granted phase not yet released).
- ``requests``: job -> `PhaseRequest`, the phase the job waits for: the nodes it needs, and
  ``keeps_turn`` when the job's next phase continues this one on the same nodes (Train then Sync):
  the turn then stays with the job until the phase that ends it is granted.
- ``usable``: nodes that may be granted at all (ready, sidecar connected); ``skip``: jobs whose turn
  is passed over (their lease lapsed or was revoked and they have not asked again; they wait for
  their next turn), so a dead job never stops the rotation.
- ``lend``: work conservation. A free node whose turn's job does not request it (that job is busy in
  another phase elsewhere) is lent to a request whose job is there to run it (``ready``: it asked),
  the longest-waiting first (`PhaseRequest.since`), instead of idling until the turn's job comes
  back. A loan does not move the turn: the job whose turn it is gets the node as soon as it asks and
  the borrower's phase ends, so a loan delays it by at most one phase, and it still gets its turn
  once per meta-iteration. The live coordinator lends; the simulator keeps the strict order, the
  schedule the SLO check computes (a loan only ever runs a phase earlier than that schedule would).

`GrantStep.grants` lists the grants in a deterministic order; `GrantStep.served` gives, for every
ring whose turn moved, the job whose turn ended there (granted, or passed over): keep it, and the
next call's ring is `Ring.following(order, served)`. A step only
consumes free nodes, so one pass decides everything grantable now; call it again after any
release, request, or change in node usability.

A new kind of request (for example a colocated job whose rollout runs on training-pool nodes) needs
no change here: list those nodes in its request, and the rings of those nodes in their order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from rollmux.coordinator.policy.api import PolicyError
from rollmux.coordinator.policy.state import GroupState


@dataclass(frozen=True, slots=True, kw_only=True)
class Ring:
    """The jobs that take turns on one node, in round-robin order, and whose turn it is."""

    order: tuple[str, ...]
    turn: str  # a member of `order`

    def __post_init__(self) -> None:
        if self.order and self.turn not in self.order:
            raise PolicyError(f"ring turn {self.turn!r} is not one of its jobs {self.order}")

    @classmethod
    def following(cls, order: tuple[str, ...], served: str | None) -> Ring:
        """The ring whose turn follows the job served last (the first job when none was, or it left)."""
        if served in order:
            return cls(order=order, turn=order[(order.index(served) + 1) % len(order)])
        return cls(order=order, turn=order[0] if order else "")

    def after(self, job: str) -> str:
        """The job whose turn follows `job`'s."""
        return self.order[(self.order.index(job) + 1) % len(self.order)]

    def before(self, job: str) -> str:
        """The job whose turn precedes `job`'s."""
        return self.order[self.order.index(job) - 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseRequest:
    """A job waiting for one phase: the nodes it needs all at once."""

    job: str
    nodes: tuple[str, ...]
    keeps_turn: bool = False  # the job's next phase continues on these nodes within the same turn
    continues: bool = False  # the job's previous phase just let go of these nodes and this one follows on them
    # (Train -> Sync): it goes first whoever's turn it is (the same turn, or the same loan, goes on)
    ready: bool = True  # the job asked for the phase (False: queued at its previous phase's release, no ask
    # yet); only a ready request borrows a node (`lend`)
    since: float = 0.0  # when the job asked (s, any clock): loans go to the longest-waiting request first

    def __post_init__(self) -> None:
        if not self.nodes:
            raise PolicyError(f"job {self.job!r} requests a phase on no nodes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    job: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GrantStep:
    grants: tuple[Grant, ...]
    served: dict[str, str]  # node -> the job whose turn there ended in this step (rings that moved only)


def current_turn(ring: Ring, skip: Collection[str]) -> str | None:
    """The ring's turn after passing over skipped jobs; None when every job is skipped."""
    turn = ring.turn
    for _ in ring.order:
        if turn not in skip:
            return turn
        turn = ring.after(turn)
    return None


def grant_step(rings: Mapping[str, Ring], holders: Mapping[str, str], requests: Mapping[str, PhaseRequest], *,
               usable: Collection[str], skip: Collection[str] = (), lend: bool = False) -> GrantStep:
    """Grant every request whose turn it is on all its nodes, all of them free and usable; with
    `lend`, then every request whose other nodes' turns belong to jobs that do not request them.

    Turns on different nodes move independently, so waiting requests can form a cycle that no grant
    will ever break: job X's turn on node n while X waits for node m, whose turn is Y's, while Y waits
    for n (the chaos run found one after a failover; new and leaving jobs and lapsed leases shift the
    turns out of step). Only a cycle of that kind, every job in it waiting on turns alone (no held,
    unusable or just-granted node), is broken: the turn on one of its nodes passes over its job, one
    whose waiting phase does not need that node when there is one. Outside such a deadlock the
    round-robin order is exactly as before.

    Raises:
        PolicyError: a request needs a node without a ring, or that its job is not part of.
    """
    for job in sorted(requests):
        for n in requests[job].nodes:
            if n not in rings or job not in rings[n].order:
                raise PolicyError(f"job {job!r} requests node {n} but is not in its round-robin ring")
    turns: dict[str, str] = {}
    served: dict[str, str] = {}
    for node, ring in rings.items():
        now = current_turn(ring, skip)
        if now is not None and now != ring.turn:
            turns[node], served[node] = now, ring.before(now)
    grants: list[Grant] = []
    taken: set[str] = set()  # granted in this step
    waiting = dict(requests)
    for _ in range(1 + sum(len(r.order) for r in rings.values())):  # each pass-over moves a turn on
        for job in sorted(waiting, key=lambda j: (not waiting[j].continues, j)):  # continuations first
            req = waiting[job]
            owners = {n: turns.get(n, rings[n].turn) for n in req.nodes}
            if all(n in usable and n not in holders and n not in taken and (owners[n] == job or req.continues)
                   for n in req.nodes):
                _grant(job, owners, rings, turns, served, waiting, taken=taken, grants=grants)
        if lend:
            _lend(rings, turns, served, holders, waiting, usable=usable, taken=taken, grants=grants)
        edge = deadlock_edge(rings, turns, holders, waiting, usable=usable, taken=taken)
        if edge is None:
            break
        node, job = edge
        ring = Ring(order=rings[node].order, turn=rings[node].after(job))
        turns[node], served[node] = current_turn(ring, skip) or ring.turn, job
    return GrantStep(grants=tuple(grants), served=served)


def _grant(job: str, owners: Mapping[str, str], rings: Mapping[str, Ring], turns: dict[str, str],
           served: dict[str, str], waiting: dict[str, PhaseRequest], *, taken: set[str], grants: list[Grant]) -> None:
    """Grant `job`'s waiting request; each of its nodes where it was the job's own turn moves the turn on
    (a continued loan or a lent node leaves the turn where it is)."""
    req = waiting.pop(job)
    grants.append(Grant(job=job, nodes=req.nodes))
    taken.update(req.nodes)
    if not req.keeps_turn:
        for n in req.nodes:
            if owners[n] == job:
                turns[n], served[n] = rings[n].after(job), job


def _lend(rings: Mapping[str, Ring], turns: dict[str, str], served: dict[str, str], holders: Mapping[str, str],
          waiting: dict[str, PhaseRequest], *, usable: Collection[str], taken: set[str], grants: list[Grant]) -> None:
    """Grant ready waiting requests, longest-waiting first, on free usable nodes whose turn is theirs
    or belongs to a job that does not request the node (see the module docstring). A node where it
    was the request's own turn moves on as for any grant; a lent node keeps its turn."""
    for job in sorted((j for j in waiting if waiting[j].ready), key=lambda j: (waiting[j].since, j)):
        req = waiting[job]
        owners = {n: turns.get(n, rings[n].turn) for n in req.nodes}
        if all(n in usable and n not in holders and n not in taken
               and (owners[n] == job or owners[n] not in waiting or n not in waiting[owners[n]].nodes)
               for n in req.nodes):
            _grant(job, owners, rings, turns, served, waiting, taken=taken, grants=grants)


def deadlock_edge(rings: Mapping[str, Ring], turns: Mapping[str, str], holders: Mapping[str, str],
                  waiting: Mapping[str, PhaseRequest], *, usable: Collection[str],
                  taken: Collection[str] = ()) -> tuple[str, str] | None:
    """(node, job) whose turn closes a cycle of requests waiting on turns alone, or None.

    A request waits on turns alone when each of its nodes is usable and free and, where it is not the
    request's turn, the turn is another waiting job's. Such requests point at those jobs; a cycle
    among them never moves by itself. Of the cycle's edges, the first whose job does not need the
    node (it waits elsewhere) is returned, else the first edge; the order is deterministic.
    """
    edges: dict[str, list[tuple[str, str]]] = {}  # job -> [(node, job whose turn it is there)]
    for job in sorted(waiting):
        out = []
        for n in waiting[job].nodes:
            if n not in usable or n in holders or n in taken:
                break
            turn = turns.get(n, rings[n].turn)
            if turn != job:
                if turn not in waiting:
                    break
                out.append((n, turn))
        else:
            if out:
                edges[job] = out
    state: dict[str, int] = {}  # 1: on the current path, 2: explored
    for job in sorted(edges):
        if job not in state and (cycle := _cycle_from(job, edges, state, [])) is not None:
            for _, node, blocker in cycle:
                if node not in waiting[blocker].nodes:
                    return node, blocker
            return cycle[0][1], cycle[0][2]
    return None


def _cycle_from(job: str, edges: Mapping[str, list[tuple[str, str]]], state: dict[str, int],
                path: list[tuple[str, str, str]]) -> list[tuple[str, str, str]] | None:
    """Depth-first search from `job` for a cycle of `edges` (`path`: the (from job, node, to job)
    steps taken so far); a module function, not a closure, so that a grant step leaves no
    reference cycle for the collector (the coordinator runs one per grant)."""
    state[job] = 1
    for node, nxt in edges.get(job, ()):
        if nxt not in edges:
            continue
        path.append((job, node, nxt))
        if state.get(nxt) == 1:
            start = next(i for i, (frm, _, _) in enumerate(path) if frm == nxt)
            return path[start:]
        if nxt not in state and (found := _cycle_from(nxt, edges, state, path)) is not None:
            return found
        path.pop()
    state[job] = 2
    return None


def group_rings(group: GroupState, served: Mapping[str, str]) -> dict[str, Ring]:
    """The rings of a group's nodes: the members that train on each training node (all of them on an
    elastic member's, its own nodes only otherwise), the pinned jobs on each rollout node, in member
    order, each turn following the job `served` last on the node."""
    rings = {}
    for n in group.train_nodes:
        members = tuple(name for name, m in group.members.items() if n in m.train_nodes)
        if members:
            rings[n] = Ring.following(members, served.get(n))
    for n, node in group.rollout.items():
        if node.jobs:
            rings[n] = Ring.following(tuple(node.jobs), served.get(n))
    return rings


def served_after_leaving(ring: Ring, job: str) -> str | None:
    """What to keep as the node's last served job once `job` leaves its ring, so that the turn stays
    where it was (or, when it was `job`'s, passes to the job after it); None: keep nothing."""
    if len(ring.order) < 2:
        return None
    turn = ring.after(job) if ring.turn == job else ring.turn
    rest = tuple(j for j in ring.order if j != job)
    return rest[rest.index(turn) - 1]


__all__ = ["Grant", "GrantStep", "PhaseRequest", "Ring", "current_turn", "deadlock_edge", "grant_step", "group_rings",
           "served_after_leaving"]
