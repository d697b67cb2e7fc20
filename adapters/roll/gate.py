"""Permit gates of one ROLL job: one Ray actor per pool, each a RollMux shim rank on that pool's node.

ROLL drives every phase from its driver, but a permit is held by a rank attached to the sidecar of
a node in the phase's pool (the shim's model: rollout permits on rollout-pool nodes, train and sync
permits on training-pool nodes). So the adapter starts, in the job's own Ray instance, one small
``PoolGate`` actor per pool, pinned to the node of that pool's first ROLL worker, and the driver
opens and closes phases through it. Each gate's process attaches to its node's sidecar with the
ordinary shim (``rollmux.init`` / ``rollmux.phase`` / ``rollmux.runtime_hook``).

The gate actors are named (``rollmux-gate-<pool>``) inside the job's Ray namespace so that ROLL's
rollout scheduler actor can report progress to the rollout gate.

The gates are the driver's own ranks; the GPU memory is held by ROLL's cluster workers, each a rank of
the job on its own node's sidecar (``workers.wrap_worker_init``). :class:`Gates` moves them through every
phase step with the gate (``rollmux.adapters.common.ranks.RanksGate``), so a phase runs only once every
node of a multi-node job was granted it, and ends once every rank there released it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from rollmux.adapters.common.ranks import RanksGate
from rollmux.adapters.roll.phases import Action, Step
from rollmux.core.model import PHASE_ORDER
from rollmux.shim.pools import phase_pool

log = logging.getLogger(__name__)

POOLS = ("rollout", "train")

RANKS_TIMEOUT_S = 600.0
"""Longest wait for the job's ranks to enter or release a phase (a permit wait included), unless
``ROLLMUX_PERMIT_TIMEOUT_S`` sets the permit wait."""


def gate_name(pool: str) -> str:
    return f"rollmux-gate-{pool}"


class PoolGate:
    """The body of the per-pool gate actor (wrapped with ``ray.remote`` by :func:`start_gates`)."""

    def __init__(self, *, socket: str | None, job: str, token: str, rank: int, permit_timeout_s: float | None,
                 deployment: str) -> None:
        from rollmux.shim import api as shim

        self._shim, self._job = shim, job
        shim.init(socket=socket, job=job, job_token=token, rank=rank, permit_timeout_s=permit_timeout_s,
                  deployment=deployment)
        self._ctx: Any = None
        self._phase: str | None = None  # the phase whose permit this gate holds
        self._nodes: tuple[str, ...] = ()  # the nodes that permit covers
        self._iteration = -1  # the held phase's iteration
        self._withheld = -1  # the last rollout iteration whose progress was withheld (recorded once each)
        self.reports: list[tuple[int, int, str | None]] = []
        """Every progress report the sidecar answered: (finished, total, phase held when reported)."""

    def enter(self, phase: str, iteration: int) -> dict[str, Any]:
        """Block until the job's permit for (phase, iteration) on this node is granted."""
        ctx = self._shim.phase(phase, iteration=iteration)
        held = ctx.__enter__()
        self._ctx, self._phase, self._iteration = ctx, phase, iteration
        lease = held.lease if held is not None else None
        self._nodes = () if lease is None else tuple(lease.nodes)
        return {} if lease is None else dataclasses.asdict(lease)

    def exit(self) -> None:
        """Release the held permit (reporting the phase's duration)."""
        ctx, self._ctx, self._phase, self._nodes = self._ctx, None, None, ()
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def apply(self, ops: list[tuple[str, str, int]]) -> list[float]:
        """Run (action, phase, iteration) opens / closes in order, in one actor call; returns each one's seconds."""
        out = []
        for action, phase, iteration in ops:
            t0 = time.perf_counter()
            if action == Action.OPEN.value:
                self.enter(phase, iteration)
            else:
                self.exit()
            out.append(time.perf_counter() - t0)
        return out

    def progress(self, finished: int, total: int) -> dict[str, Any] | None:
        """Rollout progress; returns the coordinator's migration directive, if any.

        Withheld while the rollout permit covers two or more nodes: the coordinator migrates such a
        rollout and frees the released nodes as it answers, and ROLL cannot move a rollout's requests
        off them mid-step (docs/how-to/run-roll.md), so another job would be granted nodes on which this one still
        generates. Its nodes come free at the rollout's end (recorded once per rollout as
        ``progress_withheld``), as the veRL adapter does."""
        if len(self._nodes) > 1:
            if self._withheld != self._iteration:
                from rollmux.adapters.common.relocation import record

                self._withheld = self._iteration
                record("progress_withheld", job=self._job, iteration=self._iteration, nodes=list(self._nodes))
            return None
        m = self._shim.runtime_hook(finished, total)
        self.reports.append((finished, total, self._phase))
        if m is None:
            return None
        # The coordinator only migrates a rollout holding two or more nodes, whose progress is withheld
        # above: a directive here is not expected; ROLL cannot move a rollout's requests mid-step.
        log.warning("rollmux: migration directive for job %s epoch %s (keep %s, release %s) not followed: the ROLL "
                    "adapter finishes the rollout where it runs", m.job, m.epoch, list(m.keep_nodes),
                    list(m.release_nodes))
        return dataclasses.asdict(m)

    def relocation(self) -> Any:
        """The job's pending relocation directive this rank heard (``rollmux.core.model.Relocation``), or None."""
        import rollmux

        return rollmux.relocation()

    def relocate(self, wait_s: float) -> tuple[Any, str | None]:
        """Acknowledge the pending directive (no permit held): (the switched directive, None) when the job
        must leave (this rank does not re-attach), else (None, the directive's state, if any)."""
        import rollmux
        from rollmux.adapters.common.relocation import acknowledge

        seen: list[Any] = []
        if acknowledge(seen.append, wait_s=wait_s):
            return seen[0], None
        now = rollmux.relocation()
        return None, None if now is None else now.state.value

    def shutdown(self, job_done: bool) -> list[tuple[int, int, str | None]]:
        """Release what is held and detach; returns the progress reports."""
        self.exit()
        self._shim.shutdown(job_done=job_done)
        return self.reports


@dataclasses.dataclass(slots=True, kw_only=True)
class Gates:
    """The driver's handles on the job's gate actors; runs a tracker's steps in order."""

    actors: dict[str, Any]
    deployment: str = "disaggregated"  # the job's mode: which pool's gate opens each phase (phase_pool)
    log: list[tuple[str, str, int, float]] = dataclasses.field(default_factory=list)
    """(action, phase, iteration, seconds) of every step run: its time in the gate; the last step of each
    gate call also carries the call's round trip, so the seconds add up to the driver's wait."""
    progress: list[tuple[int, int, str | None]] = dataclasses.field(default_factory=list)
    """The gates' progress reports (``PoolGate.reports``), collected at shutdown."""
    ranks: RanksGate | None = None
    """The job's GPU workers, each a rank on its own node (``rollmux.adapters.common.ranks``): every step
    is theirs too. None: the gates alone (no board)."""

    def run(self, steps: list[Step]) -> None:
        """Run the steps in order: one actor call per run of closes ending with at most one open on the same
        gate (a phase switch on one gate, a close then an open, costs one driver round trip, not two).

        The ranks release a phase while the gate does and enter one once the gate holds its permit, so a
        call returns once every rank of the job entered (or released) the phase on its node."""
        for pool, batch in by_gate(steps, self.deployment):
            for chunk in through_opens(batch):
                self._run_chunk(pool, chunk)

    def _run_chunk(self, pool: str, chunk: list[Step]) -> None:
        import ray

        t0 = time.perf_counter()
        closing = [self.ranks.close_ranks() for s in chunk if s.action is Action.CLOSE] if self.ranks else []
        try:
            took = ray.get(self.actors[pool].apply.remote([(s.action.value, s.phase, s.iteration) for s in chunk]))
        finally:
            for pending in closing:
                self.ranks.closed(pending)  # type: ignore[union-attr]
        last = chunk[-1]
        if self.ranks is not None and last.action is Action.OPEN:
            self.ranks.open_ranks(last.phase, last.iteration)
        trip = time.perf_counter() - t0 - sum(took)
        for i, (s, sec) in enumerate(zip(chunk, took)):
            self.log.append((s.action.value, s.phase, s.iteration, sec + (trip if i == len(chunk) - 1 else 0.0)))

    def nodes(self) -> tuple[str, ...]:
        """What ``RanksGate`` asks of its inner gate: none of its own. A gate actor holds the same permit
        as the ranks (one per job and phase), whose nodes the ranks report."""
        return ()

    def relocation(self) -> Any:
        """The pending relocation directive, as the gate of the job's Sync heard it (None: none)."""
        import ray

        return ray.get(self.actors[phase_pool("sync", self.deployment)].relocation.remote())

    def relocate(self, wait_s: float) -> tuple[Any, str | None]:
        """Acknowledge through the gate of the job's Sync (see ``PoolGate.relocate``)."""
        import ray

        return ray.get(self.actors[phase_pool("sync", self.deployment)].relocate.remote(wait_s))

    def shutdown(self, *, job_done: bool) -> None:
        """Detach the ranks, then release and detach the gates (the training gate deregisters a done job)."""
        import ray

        if self.ranks is not None:
            self.ranks.detach()  # the job's ranks leave their sidecars before the job deregisters
        refs = [a.shutdown.remote(job_done and pool == "train") for pool, a in self.actors.items()]
        self.progress = [row for rows in ray.get(refs, timeout=60) for row in rows]
        for a in self.actors.values():
            ray.kill(a)


def through_opens(steps: list[Step]) -> list[list[Step]]:
    """Split `steps` after each open: every part is closes followed by at most one open."""
    out: list[list[Step]] = [[]]
    for s in steps:
        out[-1].append(s)
        if s.action is Action.OPEN:
            out.append([])
    return [part for part in out if part]


def by_gate(steps: list[Step], deployment: str) -> list[tuple[str, list[Step]]]:
    """Split `steps` into runs of consecutive steps whose phases share a gate (``phase_pool``), in order."""
    out: list[tuple[str, list[Step]]] = []
    for s in steps:
        pool = phase_pool(s.phase, deployment)
        if out and out[-1][0] == pool:
            out[-1][1].append(s)
        else:
            out.append((pool, [s]))
    return out


def start_gates(*, sockets: dict[str, str | None], job: str, token: str, node_ids: dict[str, str | None],
                permit_timeout_s: float | None, deployment: str = "disaggregated",
                env_vars: dict[str, str] | None = None) -> Gates:
    """Start one gate actor per pool the job's phases run on (both pools when disaggregated, the one
    pool of a co-located job) on that pool's node, and wait until each is attached.

    Args:
        sockets: pool -> the sidecar socket path on that pool's node; None (or absent): the socket the
            platform names in the gate's own node's environment (a multi-node job's gate attaches there).
        node_ids: pool -> Ray node id of that pool's first ROLL worker (None: anywhere).
        env_vars: the job's variables for the gates' processes (``registration.job_env``: its event log,
            permit timeout), which a cluster the driver only connected to does not give them.

    Raises:
        The shim's SidecarUnreachableError / ShimConfigError (re-raised from the actor) when a
        sidecar cannot be reached.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(num_cpus=0, max_concurrency=4)(PoolGate)
    actors = {}
    used = {phase_pool(p, deployment) for p in PHASE_ORDER}
    for rank, pool in enumerate(p for p in POOLS if p in used):
        node = node_ids.get(pool)
        opts: dict[str, Any] = {"name": gate_name(pool), "get_if_exists": False}
        if env_vars:
            opts["runtime_env"] = {"env_vars": dict(env_vars)}
        if node:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        actors[pool] = cls.options(**opts).remote(socket=sockets.get(pool), job=job, token=token, rank=rank,
                                                  permit_timeout_s=permit_timeout_s, deployment=deployment)
    try:
        ray.get([a.__ray_ready__.remote() for a in actors.values()], timeout=120)
    except ray.exceptions.RayActorError as exc:
        raise _unwrap(exc) from None
    gates = Gates(actors=actors, deployment=deployment)
    gates.ranks = RanksGate(job=job, inner=gates, timeout_s=permit_timeout_s or RANKS_TIMEOUT_S)
    return gates


def _unwrap(exc: Exception) -> Exception:
    """The shim's own error out of a Ray actor-creation failure (keeps the remedy in the message)."""
    cause = getattr(exc, "cause", None)
    inner = getattr(cause, "cause", cause)
    return inner if isinstance(inner, Exception) else exc
