"""A small synchronous client of the coordinator, for the sidecar, the shim and operators.

    from rollmux.wire.client import CoordinatorClient
    client = CoordinatorClient("coord:50051")                     # or a list of addresses (standby)
    job = client.register_job(JobSpec(name="a", n_rollout_gpus=8, n_train_gpus=8))
    with job.hold(Phase.ROLLOUT, 0, timeout_s=600) as permit:    # blocks until granted; renews
        ...                                                       # released with measured duration
    permit = job.acquire(Phase.TRAIN, 0, timeout_s=600)           # or by hand: acquire/renew/release
    job.release(permit, duration_s=12.5)

Every call retries UNAVAILABLE (coordinator restarting, Redis recovering, standby taking over),
DEADLINE_EXCEEDED and CANCELLED (which a blocking call only gets from the server side: gRPC's
server sheds calls beyond its pending-call limit as CANCELLED before any handler runs) with
exponential backoff for up to `retry_s`, rotating through the given addresses. Refusals raise the
same `ServiceError` subclasses the server raised (`StaleEpochError`, `PermissionDeniedError`, ...),
chosen by the error code the call carried back (`rollmux.wire.errors`). Every argument and answer is
a `rollmux.core.model` type; `rollmux.wire.convert` turns them into messages and back.
"""

from __future__ import annotations

import contextlib
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rollmux.core.model import (
    ClusterInfo,
    JobInfo,
    JobSpec,
    Lease,
    Migration,
    NodeEvent,
    Phase,
    Pool,
    Relocation,
)
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
from rollmux.wire import convert
from rollmux.wire.auth import bearer_metadata
from rollmux.wire.errors import (
    JobRemovedError,
    PermitTimeoutError,
    ServiceError,
    StaleEpochError,
    error_from_rpc,
)

NODE_METADATA_KEY = "x-rollmux-node"
"""gRPC metadata naming the node of a NodeStream."""

_RETRIABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
"""Codes a blocking call retries. This client never cancels a call it waits on, so CANCELLED comes
from the server: shed under a burst (see `server.MAX_PENDING_CALLS`) or cut by its shutdown."""


class CoordinatorClient:
    """Connection to the coordinator (or to a leader and its standbys).

    Args:
        targets: ``host:port`` or several; UNAVAILABLE rotates to the next one.
        token: the operator token (operator calls and RegisterJob) when the coordinator has a secret.
        retry_s: how long each call keeps retrying while the coordinator is unavailable.
        root_certificates: PEM bytes to use TLS.
    """

    def __init__(self, targets: str | Sequence[str], *, token: str | None = None, retry_s: float = 30.0,
                 root_certificates: bytes | None = None) -> None:
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        self.token = token
        self.retry_s = retry_s
        self._creds = grpc.ssl_channel_credentials(root_certificates) if root_certificates else None
        self._index = 0
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, index: int | None = None) -> pb_grpc.CoordinatorStub:
        """The stub of target `index` (default: the one that answered last)."""
        with self._lock:
            target = self.targets[(self._index if index is None else index) % len(self.targets)]
            ch = self._channels.get(target)
            if ch is None:
                opts = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 1000),
                        ("grpc.max_receive_message_length", 256 * 1024 * 1024)]  # cluster state is large
                ch = (grpc.secure_channel(target, self._creds, options=opts) if self._creds
                      else grpc.insecure_channel(target, options=opts))
                self._channels[target] = ch
            return pb_grpc.CoordinatorStub(ch)

    def call(self, method: str, request: Any, *, token: str | None = None, timeout_s: float = 10.0,
             metadata: Sequence[tuple[str, str]] = (), retry_s: float | None = None,
             target: int | None = None) -> Any:
        """Invoke `method`, retrying UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED with backoff for up to
        `retry_s` (default: the client's) from its first failure (a long-polling call that fails after
        minutes still gets its retries). Every call is safe to repeat: registrations carry a nonce,
        permit calls an epoch (a repeated release answers `already_released`).

        `target` (an index into the targets) starts the call there instead of at the last one that answered.

        Raises:
            ServiceError: the coordinator refused the call (or stayed unavailable).
        """
        md = list(metadata)
        tok = token if token is not None else self.token
        if tok:
            md.append(bearer_metadata(tok))
        window = self.retry_s if retry_s is None else retry_s
        deadline = 0.0  # set at the first failure: a long server-side wait does not use up the retry window
        delay = 0.02
        index = self._index if target is None else target  # walked by this call alone: others cannot skip one
        while True:
            try:
                resp = getattr(self._stub(index), method)(request, timeout=timeout_s, metadata=md)
                self._index = index  # the next calls start at the target that answered
                return resp
            except grpc.RpcError as exc:
                retriable = exc.code() in _RETRIABLE
                deadline = deadline or time.monotonic() + window
                if not retriable or time.monotonic() + delay > deadline:
                    raise error_from_rpc(exc) from None
                index += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    # ---- job side --------------------------------------------------------------------------
    def register_job(self, spec: JobSpec, *, nonce: str | None = None, relay_node: str = "",
                     token: str | None = None, attachable: bool = False) -> JobClient:
        """Register a job; returns its handle (keep `handle.token` to reconnect after a crash).

        Args:
            spec: the job.
            nonce: secret making a retry idempotent (default: a fresh random one).
            relay_node: set by a sidecar relaying a local job's registration; `token` is then its node token.
            token: overrides the client's operator token for this call.
            attachable: registered on the job's behalf (the Kubernetes scheduler): the job's driver,
                relayed by a sidecar of one of its placed nodes, takes the registration over once.
        """
        nonce = nonce or secrets.token_urlsafe(24)
        req = pb.RegisterJobRequest(spec=convert.spec_to_pb(spec), nonce=nonce, relay_node=relay_node,
                                    attachable=attachable)
        resp = self.call("RegisterJob", req, token=token)
        job = JobClient(self, spec.name, resp.job_token, convert.job_info_from_pb(resp.status))
        job.deployment = resp.deployment or None
        return job

    def job(self, name: str, token: str) -> JobClient:
        """A handle on an already registered job (e.g. a restarted trainer)."""
        return JobClient(self, name, token, None)

    # ---- node side -------------------------------------------------------------------------
    def register_node(self, node_id: str, pool: Pool, *, gpu_type: str, gpu_count: int, host_dram_bytes: int,
                      nvml: dict[str, str] | None = None, token: str | None = None,
                      retry_s: float | None = None, target: int | None = None) -> str:
        """Register (or re-register) a node; returns its state at the coordinator (a NodeState value)."""
        req = pb.RegisterNodeRequest(node_id=node_id, pool=convert.POOL_TO_PB[pool], gpu_type=gpu_type,
                                     gpu_count=gpu_count, host_dram_bytes=host_dram_bytes, nvml=nvml or {})
        return self.call("RegisterNode", req, token=token, retry_s=retry_s, target=target).state

    def report_attach(self, node_id: str, job: str, *,
                      token: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A node's sidecar attached the first local rank of `job` (I4); `token` is its node token.
        Returns (the job's placed nodes, empty while pending; the nodes its ranks attached on).

        Raises:
            FailedPreconditionError: the job is admitted on other nodes (the message names both sets).
        """
        resp = self.call("ReportAttach", pb.ReportAttachRequest(node_id=node_id, job=job), token=token)
        return tuple(resp.placement_nodes), tuple(resp.attach_nodes)

    # ---- operator side ---------------------------------------------------------------------
    def cluster_state(self) -> ClusterInfo:
        return convert.cluster_info_from_pb(self.call("GetClusterState", pb.ClusterStateRequest()))

    def drain_node(self, node_id: str) -> str:
        return self.call("DrainNode", pb.DrainNodeRequest(node_id=node_id)).state

    def remove_job(self, name: str) -> list[str]:
        return list(self.call("RemoveJob", pb.RemoveJobRequest(job=name)).released_nodes)


class JobClient:
    """One job's calls, authenticated with its job token."""

    def __init__(self, client: CoordinatorClient, name: str, token: str, info: JobInfo | None) -> None:
        self.client, self.name, self.token = client, name, token
        self.registration = info  # status at registration (None for `CoordinatorClient.job`)
        self.deployment: str | None = None  # deployment mode chosen at registration, when the coordinator says

    def __repr__(self) -> str:  # never show the token
        return f"JobClient(name={self.name!r}, token=<hidden>)"

    def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        return self.client.call(method, request, token=self.token, timeout_s=timeout_s)

    def status(self) -> JobInfo:
        return convert.job_info_from_pb(self._call("GetJob", pb.GetJobRequest(job=self.name)))

    def acquire(self, phase: Phase, iteration: int, *, timeout_s: float = 300.0) -> Lease:
        """Block (server side) until the permit for `phase` of `iteration` is granted.

        Idempotent: asking again for a permit already granted returns the same lease.

        Raises:
            PermitTimeoutError: not granted within `timeout_s` (the message names the blocker).
            JobRemovedError: the job was removed while waiting.
            FailedPreconditionError: `phase`/`iteration` is not the job's next phase.
        """
        deadline = time.monotonic() + timeout_s
        reason = "no answer yet"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PermitTimeoutError(f"job {self.name!r} {phase.value}({iteration}) not granted within "
                                         f"{timeout_s:g}s: {reason}")
            wait = min(remaining, 60.0)
            req = pb.AcquirePermitRequest(job=self.name, phase=convert.PHASE_TO_PB[phase], iteration=iteration,
                                          timeout_s=wait)
            resp = self._call("AcquirePermit", req, timeout_s=wait + 5.0)
            if resp.outcome == pb.WAIT_OUTCOME_GRANTED:
                return convert.lease_from_pb(resp.lease)
            if resp.outcome == pb.WAIT_OUTCOME_JOB_REMOVED:
                raise JobRemovedError(resp.reason)
            reason = resp.reason

    def renew(self, permit: Lease) -> float:
        """Extend the lease. Raises `StaleEpochError` if it was lost (stop the phase at once)."""
        return self._call("RenewPermit", pb.RenewPermitRequest(job=self.name, epoch=permit.epoch)).ttl_s

    def release(self, permit: Lease, duration_s: float, *, node_id: str = "") -> tuple[Phase, int]:
        """End the phase; returns the job's next (phase, iteration). Safe to retry.

        Args:
            node_id: the node whose sidecar releases: that node alone is freed, and the job's next phase
                is queued once every node of the permit released; "" (a client without a sidecar)
                releases every node at once.
        """
        resp = self._call("ReleasePermit", pb.ReleasePermitRequest(job=self.name, epoch=permit.epoch,
                                                                   duration_s=duration_s, node_id=node_id))
        return convert.phase_from_pb(resp.next_phase), resp.next_iteration

    def advance(self, permit: Lease, duration_s: float, *, timeout_s: float = 300.0, node_id: str = "") -> Lease:
        """End the phase and block until the job's next phase is granted: `release` then `acquire`
        in one round trip and one durable commit. Safe to retry (a repeated release is recognised).

        Args:
            node_id: as `release`: that node alone is released, and the wait lasts until the permit's
                other nodes released too.

        Raises:
            StaleEpochError: `permit` no longer holds the lease (nothing was released).
            PermitTimeoutError / JobRemovedError: as `acquire`, for the next phase.
        """
        wait = min(timeout_s, 60.0)
        req = pb.AdvancePermitRequest(job=self.name, epoch=permit.epoch, duration_s=duration_s, timeout_s=wait,
                                      node_id=node_id)
        resp = self._call("AdvancePermit", req, timeout_s=wait + 5.0)
        nxt = resp.next
        if nxt.outcome == pb.WAIT_OUTCOME_GRANTED:
            return convert.lease_from_pb(nxt.lease)
        if nxt.outcome == pb.WAIT_OUTCOME_JOB_REMOVED:
            raise JobRemovedError(nxt.reason)
        phase = convert.phase_from_pb(resp.released.next_phase)
        return self.acquire(phase, resp.released.next_iteration, timeout_s=max(0.0, timeout_s - wait))

    def report_progress(self, permit: Lease, finished: int, total: int) -> Migration | None:
        """Report rollout progress (also renews); returns a migration directive once tail-bound."""
        resp = self._call("ReportProgress", pb.ReportProgressRequest(job=self.name, epoch=permit.epoch,
                                                                     finished=finished, total=total))
        return convert.migration_from_pb(resp.migrate) if resp.HasField("migrate") else None

    def ack_relocation(self, epoch: int) -> tuple[Relocation, str]:
        """Acknowledge relocation directive `epoch` (at an iteration boundary); safe to retry.

        Returns:
            The directive as it stands now (SWITCHED: run on its nodes from the next phase on;
            PENDING: not at a boundary yet, acknowledge again at the next one) and the coordinator's note.
        """
        resp = self._call("AckRelocation", pb.AckRelocationRequest(job=self.name, epoch=epoch))
        return convert.relocation_from_pb(resp.directive), resp.note

    def deregister(self) -> list[str]:
        return list(self._call("DeregisterJob", pb.DeregisterJobRequest(job=self.name)).released_nodes)

    @contextlib.contextmanager
    def hold(self, phase: Phase, iteration: int, *, timeout_s: float = 300.0) -> Iterator[HeldPermit]:
        """Acquire, renew every ttl/4 in a background thread, release with the measured duration.

        If a renewal is refused, `held.lost` is set: the phase must stop (its nodes went to another job).
        """
        permit = self.acquire(phase, iteration, timeout_s=timeout_s)
        held = HeldPermit(permit=permit, lost=threading.Event())
        stop = threading.Event()

        def renew_loop() -> None:
            while not stop.wait(permit.ttl_s / 4):
                try:
                    self.renew(permit)
                except StaleEpochError:
                    held.lost.set()
                    return
                except ServiceError:
                    continue

        t = threading.Thread(target=renew_loop, name=f"rollmux-renew-{self.name}", daemon=True)
        start = time.monotonic()
        t.start()
        try:
            yield held
        finally:
            stop.set()
            t.join()
        if not held.lost.is_set():
            self.release(permit, time.monotonic() - start)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldPermit:
    permit: Lease
    lost: threading.Event  # set when the lease was lost mid-phase


class NodeSession:
    """A node's registration and its one bidirectional stream, kept alive with reconnect backoff.

    Runs in a daemon thread: registers the node, opens NodeStream, sends a heartbeat every
    `heartbeat_s` carrying `active_epochs()`, and hands every event of the stream to `on_message`.

    Args:
        client: the connection.
        node_id / pool / gpu_type / gpu_count / host_dram_bytes / nvml: what RegisterNode sends.
        token: the node token (derive it with `auth.node_token(secret, node_id)`).
        on_message: called from the session thread for each event (first a `NodeSnapshot`).
        active_epochs: epochs the node's ranks are running now (renews those leases).
        facts: optional refreshed facts for each heartbeat's ``nvml`` map.
    """

    def __init__(self, client: CoordinatorClient, node_id: str, pool: Pool, *, gpu_type: str, gpu_count: int,
                 host_dram_bytes: int, nvml: dict[str, str] | None = None, token: str | None = None,
                 on_message: Callable[[NodeEvent], None] = lambda m: None,
                 active_epochs: Callable[[], Sequence[int]] = lambda: (), heartbeat_s: float = 1.0,
                 facts: Callable[[], dict[str, str]] | None = None) -> None:
        self.client, self.node_id, self.token = client, node_id, token
        self.facts = facts  # refreshed facts sent with every heartbeat (e.g. cached-state host DRAM)
        self._register = dict(pool=pool, gpu_type=gpu_type, gpu_count=gpu_count, host_dram_bytes=host_dram_bytes,
                              nvml=nvml or {})
        self.on_message, self.active_epochs, self.heartbeat_s = on_message, active_epochs, heartbeat_s
        self._stop = threading.Event()
        self.connected = threading.Event()
        self.last_error: ServiceError | None = None  # why the last attempt to connect failed (None: it did not)
        self._thread = threading.Thread(target=self._run, name=f"rollmux-node-{node_id}", daemon=True)
        self._call: Any = None
        self._reports: queue.Queue[pb.NodeUp] = queue.Queue()  # sent between heartbeats

    def report_unused(self, job: str, epoch: int) -> None:
        """Tell the coordinator that grant `epoch` of `job` reached this node with no rank of the job
        here (best effort: sent on the open stream, dropped if the stream ends first)."""
        self._reports.put(pb.NodeUp(unused=pb.GrantWithoutRank(job=job, epoch=epoch)))

    def start(self) -> NodeSession:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(2)  # a daemon thread: a registration retry still sleeping must not hold up a shutdown

    def _requests(self) -> Iterator[pb.NodeUp]:
        # the first gap is a random 50-100% of the period, so that sidecars whose streams opened
        # together (a fleet reconnecting after a failover) do not beat together ever after
        gap = self.heartbeat_s * random.uniform(0.5, 1.0)
        while not self._stop.is_set():
            yield pb.NodeUp(heartbeat=pb.NodeHeartbeat(active_epochs=list(self.active_epochs()),
                                                       nvml=self.facts() if self.facts else {}))
            beat = time.monotonic() + gap
            while not self._stop.is_set() and (left := beat - time.monotonic()) > 0:
                try:
                    report = self._reports.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                yield report
            gap = self.heartbeat_s

    def _run(self) -> None:
        delay = 0.05
        target = 0  # this session's own walk over the targets (other threads' calls must not move it)
        while not self._stop.is_set():
            try:
                # one attempt per round: this loop's own backoff retries, and `last_error` stays current
                self.client.register_node(self.node_id, token=self.token, retry_s=0.0, target=target,
                                          **self._register)  # type: ignore[arg-type]
                md = [(NODE_METADATA_KEY, self.node_id)]
                if self.token:
                    md.append(bearer_metadata(self.token))
                self._call = self.client._stub(target).NodeStream(self._requests(), metadata=md)  # noqa: SLF001
                for msg in self._call:
                    self.connected.set()
                    self.last_error = None
                    delay = 0.05
                    event = convert.node_event_from_pb(msg)
                    if event is not None:
                        self.on_message(event)
            except ServiceError as exc:
                self.last_error = exc
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    self.last_error = error_from_rpc(exc)
            self.connected.clear()
            if self._stop.wait(delay):
                return
            target += 1
            delay = min(delay * 2, 1.0)
