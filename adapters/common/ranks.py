"""Every process of a job that holds GPU memory is a rank on its own node's sidecar (invariant I3).

A framework drives its phases from one controller process (veRL's TaskRunner, ROLL's driver), but the
GPU memory is held by worker processes spread over the job's nodes. Each such process calls
:func:`attach_here` once (adapters hook the framework's worker constructors): it attaches to the
sidecar named by ``ROLLMUX_SIDECAR_SOCKET`` *in its own environment* (the platform sets each node's
socket there: never in a runtime environment, which would send every worker to one node), with the
job's token, so the sidecar knows the job's real PIDs (SO_PEERCRED) and its memory check covers
exactly them. A dedicated thread then follows the controller's phase boundaries:

* the controller posts ``open(phase, iteration)`` / ``close`` on the job's :class:`Board`, a small
  named Ray actor of the job;
* each rank enters the phase on its node's sidecar (blocking until *its node's* permit is granted),
  or releases it, and acknowledges;
* :class:`RanksGate` (the controller's gate) returns from ``enter`` only once every rank is in, so no
  worker runs a phase on a node whose permit was not granted, and from ``exit`` once every rank
  released.

A rank attaching while a phase is open joins it first. The board also answers which node every rank
attached on, per pool (:meth:`Board.placement`): what the coordinator needs to pin the job's placement
to where it runs (invariant I4).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.common.relocation import record

log = logging.getLogger(__name__)

BOARD_PREFIX = "rollmux-ranks-"
"""The job's board actor is named ``rollmux-ranks-<job>`` in the job's Ray namespace."""

POLL_S = 30.0
"""Longest wait of one board poll (a rank's thread polls again after it; nothing is lost)."""


class Action:
    OPEN = "open"
    CLOSE = "close"
    DETACH = "detach"


@dataclass(slots=True)
class _RankInfo:
    key: str  # "<node>/<pid>"
    node: str  # the sidecar's node id
    pool: str  # the sidecar's pool
    pid: int
    role: str  # what the process is (the worker class)
    labels: dict[str, str]  # its Ray node's labels
    acked: int = 0  # the last command seq this rank carried out
    error: str = ""  # the last command's failure, if any
    lease_nodes: tuple[str, ...] = ()  # the nodes of the permit it holds (open phase)


@dataclass(slots=True)
class Board:
    """The body of the job's board actor: the command log the ranks follow, and their acknowledgements.

    Commands are numbered from 1; ``commands[i]`` has seq ``i + 1``.
    """

    commands: list[tuple[str, str, int]] = field(default_factory=list)  # (action, phase, iteration)
    ranks: dict[str, _RankInfo] = field(default_factory=dict)
    _cv: Any = None  # asyncio.Condition, made on the actor's loop

    def _cond(self) -> Any:
        import asyncio

        if self._cv is None:
            self._cv = asyncio.Condition()
        return self._cv

    def _open_seq(self) -> int:
        """The seq of the open command still in force (0: no phase open)."""
        if self.commands and self.commands[-1][0] == Action.OPEN:
            return len(self.commands)
        return 0

    async def join(self, key: str, node: str, pool: str, pid: int, role: str, labels: dict[str, str]) -> int:
        """Register a rank; returns the seq it has to follow after (the open phase, if any, comes next)."""
        cv = self._cond()
        async with cv:
            start = len(self.commands) - (1 if self._open_seq() else 0)
            self.ranks[key] = _RankInfo(key=key, node=node, pool=pool, pid=pid, role=role, labels=labels, acked=start)
            cv.notify_all()
            return start

    async def next(self, after: int, timeout_s: float = POLL_S) -> tuple[int, tuple[str, str, int]] | None:
        """The first command after seq `after` (waits up to `timeout_s`; None when none came)."""
        import asyncio

        cv = self._cond()
        async with cv:
            try:
                await asyncio.wait_for(cv.wait_for(lambda: len(self.commands) > after), timeout_s)
            except asyncio.TimeoutError:
                return None
            return after + 1, self.commands[after]

    async def done(self, key: str, seq: int, error: str = "", lease_nodes: tuple[str, ...] = ()) -> None:
        cv = self._cond()
        async with cv:
            rank = self.ranks.get(key)
            if rank is not None:
                rank.acked, rank.error = max(rank.acked, seq), error
                if not error:
                    rank.lease_nodes = tuple(lease_nodes)
            cv.notify_all()

    async def leave(self, key: str) -> None:
        cv = self._cond()
        async with cv:
            self.ranks.pop(key, None)
            cv.notify_all()

    async def post(self, action: str, phase: str = "", iteration: int = 0) -> int:
        cv = self._cond()
        async with cv:
            self.commands.append((action, phase, iteration))
            cv.notify_all()
            return len(self.commands)

    async def wait(self, seq: int, timeout_s: float) -> dict[str, Any]:
        """Wait until every rank carried out command `seq` (or failed it); returns
        ``{"errors": {key: why}, "missing": [key], "nodes": [lease nodes]}``."""
        import asyncio

        cv = self._cond()
        async with cv:
            with contextlib.suppress(asyncio.TimeoutError):  # the answer names who is missing
                await asyncio.wait_for(cv.wait_for(lambda: all(r.acked >= seq for r in self.ranks.values())),
                                       timeout_s)
            return {"errors": {r.key: r.error for r in self.ranks.values() if r.acked >= seq and r.error},
                    "missing": sorted(r.key for r in self.ranks.values() if r.acked < seq),
                    "nodes": sorted({n for r in self.ranks.values() for n in r.lease_nodes}),
                    "placement": self._placement()}

    async def placement(self) -> dict[str, list[str]]:
        """Pool -> the sorted node ids the job's ranks attached on (what the coordinator must place on)."""
        return self._placement()

    def _placement(self) -> dict[str, list[str]]:
        out: dict[str, set[str]] = {}
        for r in self.ranks.values():
            out.setdefault(r.pool, set()).add(r.node)
        return {pool: sorted(nodes) for pool, nodes in sorted(out.items())}

    async def describe(self) -> list[dict[str, Any]]:
        """Every rank as plain data (tests, logs)."""
        return [{"key": r.key, "node": r.node, "pool": r.pool, "pid": r.pid, "role": r.role, "labels": r.labels,
                 "acked": r.acked} for r in self.ranks.values()]


def board(job: str) -> Any:
    """The job's board actor in this Ray job's namespace, created by whoever asks first."""
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=0)(Board)
    return cls.options(name=BOARD_PREFIX + job, get_if_exists=True).remote()


# ------------------------------------------------------------------------------------------ ranks


@dataclass(slots=True)
class NodeRank:
    """This process's rank and the thread that follows the board."""

    job: str
    key: str
    handle: Any  # shim.RankHandle on this node's sidecar
    board: Any
    node: str
    thread: threading.Thread | None = None
    ctx: Any = None  # the open phase's context (None between phases)


_attached: dict[int, NodeRank] = {}  # pid -> rank (a forked child attaches on its own)
_lock = threading.Lock()


def attach_here(role: str) -> NodeRank | None:
    """Attach this process to its node's sidecar as a rank of the job (once per process) and follow
    the job's phases. A no-op when RollMux is off or the process is not one of an opted-in job's
    (no ``ROLLMUX_JOB``: a process the driver did not start).

    Args:
        role: what the process is (a worker class name), recorded with the rank.

    Raises:
        AdapterError: the job's token is not in this Ray instance.
        SidecarUnreachableError, ShimConfigError: the node's sidecar refused or cannot be reached.
    """
    from rollmux.adapters.common.registration import job_token, opted_in
    from rollmux.shim import env

    job = os.environ.get(env.JOB, "")
    if not opted_in() or not job:
        return None
    pid = os.getpid()
    with _lock:
        if pid in _attached:
            return _attached[pid]
        _attached[pid] = rank = _attach(job, job_token(job), role)
    return rank


def _attach(job: str, token: str, role: str) -> NodeRank:
    import ray

    from rollmux.shim import api as shim
    from rollmux.shim import env

    rank_no = int(os.environ.get("RANK") or 0)
    # no shim phase log: the controller's rank logs the job's phase spans; a rank's go to the adapter log
    handle = shim.attach_rank(socket=os.environ[env.SIDECAR_SOCKET], job=job, job_token=token, rank=rank_no)
    rt = handle._rt  # noqa: SLF001 - the node the sidecar answered for
    node = rt.node_id
    key = f"{node}/{os.getpid()}"
    labels = dict(ray.get_runtime_context().get_node_labels() or {})
    b = board(job)
    start = ray.get(b.join.remote(key, node, handle.pool, os.getpid(), role, labels))
    rank = NodeRank(job=job, key=key, handle=handle, board=b, node=node)
    record("rank_attached", job=job, node=node, pool=handle.pool, role=role, ray_node=labels)
    rank.thread = threading.Thread(target=_follow, args=(rank, start), name="rollmux-rank", daemon=True)
    rank.thread.start()
    return rank


def _follow(rank: NodeRank, after: int) -> None:
    """Carry out the board's commands in order until told to detach."""
    import ray

    from rollmux.wire.errors import LeaseLostError

    while True:
        try:
            got = ray.get(rank.board.next.remote(after))
        except LeaseLostError:  # the shim stopped the phase this thread holds: its release reports it
            continue
        except Exception as exc:  # noqa: BLE001 - the board (the job) is gone: leave the sidecar
            log.warning("rollmux: rank %s lost the job's board (%s); detaching", rank.key, exc)
            rank.handle.close()
            return
        if got is None:
            continue
        seq, (action, phase, iteration) = got
        after = seq
        error, nodes = "", ()
        try:
            if action == Action.OPEN:
                t_request = time.time()
                rank.ctx = rank.handle.enter(phase, iteration)
                nodes = tuple(rank.ctx.lease.nodes) if rank.ctx.lease is not None else ()
                rank.ctx.t_request = t_request
            elif action == Action.CLOSE and rank.ctx is not None:
                ctx, rank.ctx = rank.ctx, None
                rank.handle.exit(ctx)
                _record_phase(rank, ctx)
            elif action == Action.DETACH:
                rank.handle.close(job_done=False)
        except Exception as exc:  # noqa: BLE001 - reported to the controller, which stops the job
            error = f"{type(exc).__name__}: {exc}"
        ray.get(rank.board.done.remote(rank.key, seq, error, nodes))
        if action == Action.DETACH:
            return


def _record_phase(rank: NodeRank, ctx: Any) -> None:
    """The rank's part of a phase, as an adapter record (not a phase span: one span per node and job is
    the controller's, ``rollmux.demo.report.spans`` reads those)."""
    lease = ctx.lease
    record("rank_phase", job=rank.job, node=rank.node, phase=ctx.phase, iteration=ctx.iteration,
           epoch=lease.epoch if lease is not None else 0, nodes=list(lease.nodes) if lease is not None else [],
           t_request=round(ctx.t_request, 6), t_start=round(ctx.t_start, 6), t_end=round(time.time(), 6))


# ------------------------------------------------------------------------------------ controller


@dataclass(slots=True)
class RanksGate:
    """The controller's gate over the job's ranks, around its own gate (the controller's own rank, if
    it has one): ``enter`` returns once every rank entered the phase on its node, ``exit`` once every
    rank released it. Implements ``rollmux.adapters.common.phases.Gate``."""

    job: str
    inner: Any  # the controller's own gate (enter/exit/nodes)
    timeout_s: float = 600.0  # longest wait for the ranks (a permit wait included)
    board: Any = None
    held_nodes: tuple[str, ...] = ()  # the nodes the open phase's permits cover, as the ranks saw them

    def _board(self) -> Any:
        if self.board is None:
            self.board = board(self.job)
        return self.board

    def _run(self, action: str, phase: str, iteration: int) -> dict[str, Any]:
        import ray

        b = self._board()
        seq = ray.get(b.post.remote(action, phase, iteration))
        return {"seq": seq, "ref": b.wait.remote(seq, self.timeout_s)}

    def _check(self, what: str, pending: dict[str, Any]) -> dict[str, Any]:
        import ray

        out = ray.get(pending["ref"])
        if out["errors"] or out["missing"]:
            raise AdapterError(f"RollMux: job {self.job!r} could not {what} on every node: failed "
                               f"{out['errors']}, no answer from {out['missing']} within {self.timeout_s:g}s; "
                               "the job stops (a phase never runs on a node whose permit was not granted)")
        return out

    def enter(self, phase: str, iteration: int) -> Any:
        handle = self.inner.enter(phase, iteration)
        self.open_ranks(phase, iteration)
        return handle

    def exit(self, handle: Any) -> None:
        pending = self.close_ranks()  # the ranks release while the controller's own rank does
        try:
            self.inner.exit(handle)
        finally:
            self.closed(pending)

    def open_ranks(self, phase: str, iteration: int) -> None:
        """The ranks' half of :meth:`enter` (the controller's own gate entered the phase already): returns
        once every rank entered it on its node."""
        t0 = time.monotonic()
        out = self._check(f"enter {phase}({iteration})", self._run(Action.OPEN, phase, iteration))
        self.held_nodes = tuple(out["nodes"])
        record("ranks_entered", job=self.job, phase=phase, iteration=iteration, nodes=list(self.nodes()),
               placement=out["placement"], seconds=round(time.monotonic() - t0, 6))

    def close_ranks(self) -> dict[str, Any]:
        """The ranks' half of :meth:`exit`: tell them to release the open phase; pass the answer to
        :meth:`closed` once the controller's own gate released it too."""
        return self._run(Action.CLOSE, "", 0)

    def closed(self, pending: dict[str, Any]) -> None:
        """Wait until every rank released (what :meth:`close_ranks` started)."""
        self.held_nodes = ()
        self._check("release its phase", pending)

    def nodes(self) -> tuple[str, ...]:
        """The nodes the open phase's permits cover (the controller's own and its ranks')."""
        return tuple(sorted(set(self.inner.nodes()) | set(self.held_nodes)))

    def placement(self) -> dict[str, list[str]]:
        import ray

        return ray.get(self._board().placement.remote())

    def detach(self) -> None:
        """Tell every rank to detach from its sidecar (the job ends)."""
        import ray

        try:
            pending = self._run(Action.DETACH, "", 0)
            ray.get(pending["ref"], timeout=60)
        except Exception as exc:  # noqa: BLE001 - best effort: a rank's EOF ends its lease anyway
            log.warning("rollmux: job %s ranks did not all detach: %s", self.job, exc)


__all__ = ["Board", "NodeRank", "RanksGate", "attach_here", "board"]
