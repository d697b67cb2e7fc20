"""The node agent: rank leases, coordinator stream, release after all local ranks.

One :class:`NodeAgent` per node. The gRPC layer (``sidecar/server.py``) turns each rank call into
one method call here; the agent decides under one lock (which rank leads the coordinator call,
whether every local rank has released, whether the job lost a rank) and performs the slow actions
(coordinator calls, NVML polling) outside it.

Its parts: the permit relaying (``Acquire``/``Release``/``Progress``, fanned out to every local
rank of a job) in :mod:`rollmux.sidecar.agent_permits`, the relocation directives held for ranks
that attach later in :mod:`rollmux.sidecar.agent_relocations`, its records in
:mod:`rollmux.sidecar.agent_records`.

A rank's ``Attach`` stream is its lease: when it drops without ``Detach`` the rank is DEAD and the
job is aborted on this node (its other local ranks stop). The node stops renewing the job's lease, so
the coordinator frees this node alone when its part of the lease lapses (fenced by a revocation); the
job's other nodes stay held until their own ranks release them (I2). The job stays registered: a rank
death on one node is no word on the job's other nodes.

A relocation directive goes to the job's ranks attached now, and the agent keeps the job's latest
one while it is pending, to replay it to every rank of the job that attaches later (a trainer that
starts after the directive went out, a restarted rank); a job's first rank here also takes the
coordinator's word for it (``GetJob``), which covers directives issued while this node's stream was down.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
import secrets
import threading
import time
from typing import Any

from rollmux.core.errors import ErrorCode
from rollmux.core.model import JobSpec, Lease, Migration, NodeEvent, Relocation, Revocation
from rollmux.sidecar.agent_permits import PermitRelay
from rollmux.sidecar.agent_records import AgentConfig, LocalJob
from rollmux.sidecar.agent_relocations import HeldRelocations
from rollmux.sidecar.api import Connection, ConnectionState, RankLease, RankState
from rollmux.sidecar.gpu import GpuProvider, host_dram_bytes
from rollmux.wire.client import CoordinatorClient, JobClient, NodeSession
from rollmux.wire.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    PlacementMismatchError,
    RankLeaseError,
    ServiceError,
    SidecarUnreachableError,
    UnauthenticatedError,
)

log = logging.getLogger("rollmux.sidecar")

RankEvent = Lease | Revocation | Migration | Relocation
"""What a rank's ``Attach`` stream carries after it opens (None in its inbox ends the stream)."""


class NodeAgent(PermitRelay):
    """The node's agent. Thread-safe: the gRPC server calls it from many threads.

    Args:
        config: node identity and knobs.
        coordinator: the coordinator connection.
        gpu: NVML facts and per-process memory (or the no-GPU fallback).
        node_token: the node token when the coordinator has a bootstrap secret.
    """

    def __init__(self, config: AgentConfig, coordinator: CoordinatorClient, gpu: GpuProvider, *,
                 node_token: str | None = None) -> None:
        self.config, self.coordinator, self.gpu, self.node_token = config, coordinator, gpu, node_token
        self.connection = Connection(node_id=config.node_id)
        self.events: list[str] = []  # recent node events, newest last (NodeStatus)
        self._cv = threading.Condition()
        self._jobs: dict[str, LocalJob] = {}
        self._ranks: dict[str, RankLease] = {}
        self._inbox: dict[str, queue.Queue[RankEvent | None]] = {}  # rank_id -> events for its Attach stream
        self._seq = 0
        self._relocations = HeldRelocations()  # pending directives, replayed to ranks attaching later
        self._stop = threading.Event()
        self._session: NodeSession | None = None
        self._monitor = threading.Thread(target=self._watch_connection, name="rollmux-conn", daemon=True)
        self._log_lock = threading.Lock()

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> NodeAgent:
        facts = self.gpu.facts()
        self._session = NodeSession(
            self.coordinator, self.config.node_id, self.config.pool, gpu_type=facts.gpu_type,
            gpu_count=facts.gpu_count, host_dram_bytes=host_dram_bytes(), nvml=facts.nvml,
            token=self.node_token, on_message=self._on_message, active_epochs=self.active_epochs,
            heartbeat_s=self.config.heartbeat_s, facts=self.heartbeat_facts).start()
        self._monitor.start()
        return self

    def wait_connected(self, timeout_s: float) -> bool:
        """Block until the coordinator stream is up (first snapshot), or `timeout_s` passes."""
        assert self._session is not None, "start() first"
        return self._session.connected.wait(timeout_s)

    def connect_error(self) -> ServiceError | None:
        """Why the coordinator stream is not up, as the coordinator (or the transport) answered."""
        return self._session.last_error if self._session is not None else None

    def stop(self) -> None:
        """Close the coordinator stream; rank leases end with the process."""
        self._stop.set()
        with self._cv:
            if self.connection.state is not ConnectionState.CLOSED:
                self.connection.move(ConnectionState.CLOSED, "sidecar shutdown")
            self._cv.notify_all()
        if self._session is not None:
            self._session.stop()

    def _watch_connection(self) -> None:
        assert self._session is not None
        while not self._stop.wait(0.05):
            up = self._session.connected.is_set()
            with self._cv:
                state = self.connection.state
                if up and state in (ConnectionState.CONNECTING, ConnectionState.RECONNECTING):
                    if state is ConnectionState.RECONNECTING:
                        self.connection.reconnects += 1
                    self.connection.move(ConnectionState.CONNECTED, "snapshot received")
                elif not up and state is ConnectionState.CONNECTED:
                    self.connection.move(ConnectionState.RECONNECTING, "coordinator stream ended")
                else:
                    continue
            self._record("connection", state=self.connection.state.value)

    # ------------------------------------------------------------------------- stream callbacks
    def active_epochs(self) -> list[int]:
        """Epochs of the permits running on this node (each heartbeat renews them)."""
        with self._cv:
            return [j.permit.epoch for j in self._jobs.values() if j.permit is not None]

    def cached_state_host_bytes(self) -> int:
        """Host DRAM held by the state caches of live ranks, as they last reported it."""
        with self._cv:
            return sum(r.host_bytes for r in self._ranks.values() if r.live)

    def heartbeat_facts(self) -> dict[str, str]:
        with self._cv:
            ranks = sum(r.live for r in self._ranks.values())
        return {"cached_state_host_bytes": str(self.cached_state_host_bytes()), "live_ranks": str(ranks)}

    def _on_message(self, event: NodeEvent) -> None:
        if isinstance(event, Lease):
            self._fan_out(event.job, event)
        elif isinstance(event, Revocation):
            r = event
            with self._cv:
                job = self._jobs.get(r.job)
                if job is not None and job.permit is not None and job.permit.epoch == r.epoch:
                    job.permit = None  # stop renewing; its ranks must stop the phase
                    job.last_released_epoch = max(job.last_released_epoch, r.epoch)
                    for rank in job.live_ranks():
                        if rank.state is RankState.RUNNING:
                            rank.move(RankState.IDLE, f"lease epoch {r.epoch} revoked: {r.reason}")
                    self._cv.notify_all()
            self._record("revoked", job=r.job, epoch=r.epoch, reason=r.reason)
            self._fan_out(r.job, r)
        elif isinstance(event, Migration):
            self._fan_out(event.job, event)
        elif isinstance(event, Relocation):
            d = event
            self._record("relocation", job=d.job, epoch=d.epoch, state=d.state.value)
            with self._cv:  # held and fanned out in one step: a rank attaching meanwhile gets it exactly once
                self._relocations.hold(d)
                self._fan_out(d.job, d)

    def _fan_out(self, job_name: str, event: RankEvent) -> None:
        """Queue `event` for every live rank of the job here (their ``Attach`` streams send it)."""
        with self._cv:  # queued under the lock, so that no replay on attach can overtake it
            job = self._jobs.get(job_name)
            ranks = job.live_ranks() if job else []
            for r in ranks:
                if r.rank_id in self._inbox:
                    self._inbox[r.rank_id].put(event)
        if not ranks and isinstance(event, Lease):
            self._grant_without_rank(job_name, event)

    def _grant_without_rank(self, job_name: str, lease: Lease) -> None:
        """A grant for a job with no rank here: the job is not where its permit says. Recorded and told
        to the coordinator, which releases this node of the permit on the job's behalf where it can."""
        self._record("grant_without_rank", job=job_name, epoch=lease.epoch, phase=lease.phase.value,
                     iteration=lease.iteration)
        if self._session is not None:
            self._session.report_unused(job_name, lease.epoch)

    # ------------------------------------------------------------------------------ rank leases
    def note(self, event: str, **fields: Any) -> None:
        """Record a node event (NodeStatus, the event log), e.g. a refused local connection."""
        self._record(event, **fields)

    def register_job(self, spec: JobSpec, nonce: str | None) -> JobClient:
        """Relay a local job's registration to the coordinator with this node's credential.

        Raises:
            ServiceError: the coordinator refused it (bad spec, name taken, relaying disabled, ...).
        """
        job = self.coordinator.register_job(spec, nonce=nonce, relay_node=self.config.node_id, token=self.node_token)
        self._record("job_registered", job=job.name, relayed=True)  # never the token
        return job

    def attach(self, job_name: str, job_token: str, rank: int, pid: int, *,
               conn: str = "") -> tuple[RankLease, queue.Queue[RankEvent | None]]:
        """Open a rank's lease on connection `conn`; checks the job token against the coordinator
        on the job's first rank (or when the token differs from the one already checked).

        Raises:
            SidecarUnreachableError: the coordinator cannot be reached.
            RankLeaseError: the coordinator does not know the job or refuses its token.
        """
        with self._cv:
            job = self._jobs.get(job_name)
            fresh = (job is None or job.aborted is not None
                     or not hmac.compare_digest(job.client.token.encode(), job_token.encode()))
            heard = self._relocations.heard
        if fresh:
            client = self.coordinator.job(job_name, job_token)
            try:
                info = client.status()
                self._report_attach(job_name)
            except (NotFoundError, PermissionDeniedError, UnauthenticatedError) as exc:
                raise RankLeaseError(f"job {job_name!r} is not registered at the coordinator, or the token is "
                                     f"not its token: register it first (rollmux.register) and pass the token "
                                     f"it returned ({exc})") from None
            except PlacementMismatchError:
                raise  # the rank's error too (a RankLeaseError): it names both node sets
            except ServiceError as exc:
                if exc.code is ErrorCode.NOT_READY:
                    raise SidecarUnreachableError(
                        f"sidecar of node {self.config.node_id} cannot reach the coordinator "
                        f"{','.join(self.coordinator.targets)}: {exc}") from None
                raise RankLeaseError(f"coordinator refused job {job_name!r}: {exc}") from None
        with self._cv:
            if fresh:
                self._jobs[job_name] = LocalJob(name=job_name, client=client)
                self._relocations.adopt(job_name, info.relocation, heard)
            self._seq += 1  # the random part makes ids unguessable; they are honoured only on `conn` anyway
            lease = RankLease(rank_id=f"{job_name}/{rank}#{self._seq}.{secrets.token_urlsafe(12)}", job=job_name,
                              rank=rank, pid=pid, conn=conn)
            self._jobs[job_name].ranks[lease.rank_id] = lease
            self._ranks[lease.rank_id] = lease
            inbox: queue.Queue[RankEvent | None] = queue.Queue()
            self._inbox[lease.rank_id] = inbox
            self._relocations.replay(job_name, inbox)  # after the Attached event: the stream sends that first
        self._record("rank_attached", job=job_name, rank=rank, pid=pid)
        return lease, inbox

    def _report_attach(self, job_name: str) -> None:
        """Tell the coordinator that the job has a rank on this node (I4), before the rank is attached.

        Raises:
            PlacementMismatchError: the job is placed on other nodes (the message names both sets).
        """
        try:
            placed, attach = self.coordinator.report_attach(self.config.node_id, job_name, token=self.node_token)
        except PlacementMismatchError as exc:
            self._record("attach_refused", job=job_name, reason=str(exc))
            raise
        self._record("job_attached", job=job_name, placement=list(placed), attach_nodes=list(attach))

    def rank_gone(self, rank_id: str, *, clean: bool, job_done: bool = False, conn: str = "") -> None:
        """End a rank's lease: a clean ``Detach`` or a dropped stream (the rank died). Idempotent.

        A dead rank aborts its job on this node and stops renewing its lease here: the coordinator
        frees this node when that lapses (its TTL), and the job's other nodes when their own sidecars
        release them. A clean detach with `job_done` deregisters the finished job.

        Raises:
            RankLeaseError: a ``Detach`` for a rank id that is not live on connection `conn`.
        """
        with self._cv:
            lease = self._ranks.get(rank_id)
            if lease is None or not lease.live or lease.conn != conn:
                if clean and (lease is None or lease.conn != conn):
                    raise self._no_lease(rank_id)
                return
            job = self._jobs[lease.job]
            lease.move(RankState.DETACHED if clean else RankState.DEAD,
                       "Detach" if clean else "Attach stream dropped without Detach")
            inbox = self._inbox.pop(rank_id, None)
            lapsing = 0
            deregister = clean and job_done
            if not clean:
                job.aborted = f"rank {lease.rank} (pid {lease.pid}) of job {job.name!r} died on node " \
                              f"{self.config.node_id}"
                lapsing = job.permit.epoch if job.permit is not None else 0
                job.permit = None  # stop renewing its lease here: this node's part lapses at its TTL
            abandoned = job.permit.epoch if job.permit is not None and not job.live_ranks() else 0
            if abandoned:  # the last local rank left mid-phase: stop renewing, the lease lapses at its TTL
                job.permit = None
            if not job.live_ranks() and job.permit is None:
                self._jobs.pop(job.name, None)
            if deregister or (not clean and job.name not in self._jobs):  # the job leaves (or died) here:
                self._relocations.drop(job.name)  # its directive goes with it (a new rank re-reads it, GetJob)
            self._cv.notify_all()
        if inbox is not None:
            inbox.put(None)  # ends the rank's Attach stream
        self._record("rank_detached" if clean else "rank_dead", job=lease.job, rank=lease.rank, pid=lease.pid)
        if abandoned:
            self._record("permit_abandoned", job=job.name, epoch=abandoned)
        if not clean:
            self._record("job_aborted", job=job.name, pid=lease.pid, lapsing_epoch=lapsing,
                         reason="rank died: this node's lease lapses at its TTL")
            self._fan_out(lease.job, Revocation(job=lease.job, epoch=0, reason=job.aborted or ""))
        if deregister:
            try:
                released = job.client.deregister()
                self._record("job_deregistered", job=job.name, released=released, reason="finished")
            except (NotFoundError, PermissionDeniedError):
                pass  # another node's sidecar deregistered it first
            except ServiceError as exc:
                log.warning("could not deregister job %s: %s", job.name, exc)

    def _no_lease(self, rank_id: str) -> RankLeaseError:
        return RankLeaseError(f"rank id {rank_id[:80]!r} holds no live lease on this connection to node "
                              f"{self.config.node_id}: attach again (rollmux.init)")

    def _rank(self, rank_id: str, conn: str) -> tuple[RankLease, LocalJob]:
        """The live lease `rank_id` names, if it was attached on connection `conn` (one answer for
        unknown ids and ids of other connections: no oracle for guessing)."""
        lease = self._ranks.get(rank_id)
        if lease is None or not lease.live or lease.conn != conn:
            raise self._no_lease(rank_id)
        return lease, self._jobs[lease.job]


    # ----------------------------------------------------------------------------------- relocation
    def relocate(self, rank_id: str, epoch: int, *, conn: str = "") -> tuple[Relocation, str]:
        """Acknowledge the job's relocation directive `epoch` at the coordinator (any local rank may).

        Raises:
            RankLeaseError: unknown rank, or `epoch` names no directive of the job.
            SidecarUnreachableError: the coordinator cannot be reached.
        """
        with self._cv:
            _, job = self._rank(rank_id, conn)
        try:
            rec, note = job.client.ack_relocation(epoch)
        except FailedPreconditionError as exc:
            raise RankLeaseError(str(exc)) from None
        except ServiceError as exc:
            raise SidecarUnreachableError(f"coordinator {','.join(self.coordinator.targets)} failed the relocation "
                                          f"call for job {job.name!r}: {exc}") from None
        self._record("relocation_ack", job=job.name, epoch=epoch, state=rec.state.value, note=note)
        return rec, note

    # ------------------------------------------------------------------------------------- views
    def snapshot(self) -> dict[str, Any]:
        """Every rank lease and local job as plain data (refused calls must leave it unchanged)."""
        with self._cv:
            return {"connection": self.connection.state.value,
                    "ranks": {r.rank_id: (r.job, r.rank, r.state.value, r.host_bytes) for r in self._ranks.values()},
                    "jobs": {j.name: (j.permit.epoch if j.permit else 0, j.acquiring, j.releasing, j.aborted,
                                      j.last_released_epoch, sorted(j.ranks)) for j in self._jobs.values()}}

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"node_id": self.config.node_id, "pool": self.config.pool.value,
                    "connection": self.connection.state.value,
                    "ranks": sum(r.live for r in self._ranks.values()),
                    "cached_state_host_bytes": sum(r.host_bytes for r in self._ranks.values() if r.live),
                    "events": self.events[-20:]}

    def _record(self, event: str, **fields: Any) -> None:
        rec = {"t": round(time.time(), 6), "node": self.config.node_id, "pool": self.config.pool.value,
               "event": event, **fields}
        line = json.dumps(rec, default=str)
        with self._log_lock:
            self.events.append(line)
            del self.events[:-200]
            if self.config.event_log:
                fd = os.open(self.config.event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)
        log.info("%s %s", event, fields)


__all__ = ["AgentConfig", "LocalJob", "NodeAgent"]  # AgentConfig, LocalJob: re-exported from agent_records
