"""The `rollmux.v1.Coordinator` gRPC servicer: authenticate, validate, convert, call the core.

Each handler converts its request to domain values (refusing malformed input with
INVALID_ARGUMENT before anything changes), checks the caller's token, runs one transition through
`Coordinator.mutate` and converts the answer back. `ServiceError`s become gRPC statuses here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from rollmux.coordinator.service import validate
from rollmux.coordinator.service.auth import Authenticator
from rollmux.coordinator.service.core import Coordinator
from rollmux.coordinator.service.runtime import Notice, views
from rollmux.coordinator.service.runtime.admission import Registered
from rollmux.coordinator.service.runtime.api import (
    InvalidArgumentError,
    NodeState,
    OutOfOrderError,
    PermissionDeniedError,
    PermitState,
    ServiceError,
)
from rollmux.coordinator.service.runtime.records import PermitRecord
from rollmux.core.errors import ErrorCode, SpecError
from rollmux.core.model import (
    JobSpec,
    Node,
    Phase,
    next_phase,
)
from rollmux.proto import rollmux_v1_pb2 as pb
from rollmux.proto import rollmux_v1_pb2_grpc as pb_grpc
from rollmux.wire import convert
from rollmux.wire.auth import bearer, new_token, sha256_hex
from rollmux.wire.client import NODE_METADATA_KEY
from rollmux.wire.errors import grpc_status, trailing_metadata
from rollmux.wire.names import check_name

log = logging.getLogger("rollmux.coordinator")

_HELD_POLL_S = 0.05
"""How often a per-node AdvancePermit asks again while other nodes of the permit still hold the phase
(their release queues the next phase without a notice to this job's waiters)."""
_REGISTERED_HOW = {Registered.NEW: "", Registered.RETRIED: " again (token rotated)",
                   Registered.REATTACHED: " again on its new nodes after a relocation (re-attached, new token)",
                   Registered.ATTACHED: " by its driver on its placed nodes (attached, new token)"}


def oversized(request: Any, limit: int) -> str:
    """Why `request` is refused for its size, naming its biggest field (called only when over `limit`)."""
    sizes = []
    for field, _ in request.ListFields():
        alone = type(request)()
        alone.CopyFrom(request)
        for other, _ in request.ListFields():
            if other.name != field.name:
                alone.ClearField(other.name)
        sizes.append((alone.ByteSize(), field.name))
    biggest, name = max(sizes, default=(0, "?"))
    return (f"request {type(request).__name__} is {request.ByteSize()} bytes, over the {limit}-byte limit: "
            f"field {name} alone is {biggest} bytes")


def _rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse oversized requests; map `ServiceError` to its gRPC status (anything else is INTERNAL).

    The transport accepts messages up to `server.MAX_MESSAGE_BYTES` (bigger ones get
    RESOURCE_EXHAUSTED from gRPC itself); the application limit `ServiceConfig.max_request_bytes`
    lies below it, so a too-large request gets INVALID_ARGUMENT naming its biggest field.
    """

    @functools.wraps(fn)
    async def wrapper(self: CoordinatorServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if request.ByteSize() > self.core.config.max_request_bytes:
                raise InvalidArgumentError(oversized(request, self.core.config.max_request_bytes))
            return await fn(self, request, context)
        except (ServiceError, SpecError) as exc:
            await _abort(context, exc.code, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception:  # noqa: BLE001 - the RPC edge: log it and answer INTERNAL, never UNKNOWN
            await _abort(context, ErrorCode.INTERNAL, _internal(fn.__name__, context))

    return wrapper


async def _abort(context: grpc.aio.ServicerContext, code: ErrorCode, message: str) -> None:
    """End the call with `code`'s status and the code itself in the trailing metadata."""
    await context.abort(grpc_status(code), message, trailing_metadata(code))


def _internal(method: str, context: grpc.aio.ServicerContext) -> str:
    """Log the exception being handled with a request id; the message the caller gets."""
    rid = validate.request_id(context.invocation_metadata())
    log.exception("unexpected error in %s (request id %s)", method, rid, extra={"request_id": rid,
                                                                               "method": method})
    return f"internal error in {method} (request id {rid}): the coordinator log has the details"


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """Args:
        core: the coordinator shell.
        auth: token checks.
        resolve: fills a job spec's missing times and state sizes (the profiler).
    """

    def __init__(self, core: Coordinator, auth: Authenticator, resolve: Callable[[JobSpec], JobSpec]) -> None:
        self.core = core
        self.auth = auth
        self.resolve = resolve
        released = core.metrics.permits_released
        self._pools = {True: released.labels(pool="rollout"), False: released.labels(pool="train")}

    # ------------------------------------------------------------------------------------------
    # validation helpers
    # ------------------------------------------------------------------------------------------
    def _name(self, value: str, field: str) -> str:
        return check_name(value, field, self.core.config.max_name_len)

    def _job(self, context: grpc.aio.ServicerContext, name: str) -> str:
        """Authenticate a job call, then look the job up: an unknown job and a wrong token get the
        same answer (UNAUTHENTICATED without a token, PERMISSION_DENIED with one), so names cannot
        be enumerated."""
        name = self._name(name, "job")
        self.core.require_ready()
        job = views.job(self.core.rt, name)
        self.auth.verify_job(bearer(context.invocation_metadata()), name, job.token_sha256 if job else None)
        return name

    def _duration(self, name: str, epoch: int, value: float) -> float:
        permit = views.permit(self.core.rt, name)
        held = None
        if permit is not None and permit.state is PermitState.GRANTED and permit.epoch == epoch:
            held = validate.held_s(permit.history, time.time())
        return validate.duration(value, held_s=held, max_wait_s=self.core.config.max_wait_s)

    @staticmethod
    def _epoch(value: int) -> int:
        if value <= 0:
            raise InvalidArgumentError(f"epoch={value} is invalid: expected the positive epoch of a granted lease")
        return value

    # ------------------------------------------------------------------------------------------
    # node side
    # ------------------------------------------------------------------------------------------
    @_rpc
    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext) -> Any:
        node_id = self._name(request.node_id, "node_id")
        self.auth.check_node(bearer(context.invocation_metadata()), node_id)
        pool = convert.pool_from_pb(request.pool)
        self._name(request.gpu_type, "gpu_type")
        validate.node_facts(request.gpu_count, request.host_dram_bytes, request.nvml,
                            self.core.config.max_nvml_entries)
        try:
            Node(node_id=node_id, pool=pool, gpu_type=request.gpu_type, gpu_count=request.gpu_count,
                 host_dram_bytes=request.host_dram_bytes)
        except SpecError as exc:
            raise InvalidArgumentError(str(exc)) from None
        node = await self.core.mutate(lambda rt: rt.register_node(
            node_id=node_id, pool=pool, gpu_type=request.gpu_type, gpu_count=request.gpu_count,
            host_dram_bytes=request.host_dram_bytes, nvml=dict(request.nvml)))
        log.info("node registered", extra={"node": node_id})
        return pb.RegisterNodeResponse(node_id=node_id, state=node.state.value,
                                       heartbeat_interval_s=self.core.config.heartbeat_interval_s)

    async def NodeStream(self, request_iterator: AsyncIterator[pb.NodeUp],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.NodeDown]:
        md = dict(context.invocation_metadata() or ())
        node_id = md.get(NODE_METADATA_KEY, "")
        try:
            node_id = self._name(node_id if isinstance(node_id, str) else node_id.decode(), NODE_METADATA_KEY)
            self.auth.check_node(bearer(context.invocation_metadata()), node_id)
            self.core.require_ready()
            views.node(self.core.rt, node_id)
        except ServiceError as exc:
            await _abort(context, exc.code, str(exc))
            return
        try:
            async for msg in self._node_stream(node_id, request_iterator):
                yield msg
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception:  # noqa: BLE001 - the RPC edge
            await _abort(context, ErrorCode.INTERNAL, _internal("NodeStream", context))

    async def _node_stream(self, node_id: str, request_iterator: AsyncIterator[pb.NodeUp]
                           ) -> AsyncIterator[pb.NodeDown]:
        outbox = self.core.open_stream(node_id)
        reader = asyncio.get_running_loop().create_task(self._read_heartbeats(node_id, request_iterator, outbox))
        with contextlib.suppress(ServiceError):  # not ready: the reload reconnects open streams
            await self.core.mutate(lambda rt: rt.node_connected(node_id))
        try:
            while True:
                notice = await outbox.get()
                if notice is None:
                    return
                event = views.node_event(self.core.rt, node_id, notice)
                if event is not None:
                    yield convert.node_event_to_pb(event)
        finally:
            reader.cancel()
            if self.core.close_stream(node_id, outbox) and self.core.ready:
                with contextlib.suppress(ServiceError):
                    await self.core.mutate(lambda rt: rt.node_disconnected(node_id))

    async def _read_heartbeats(self, node_id: str, requests: AsyncIterator[pb.NodeUp],
                               outbox: asyncio.Queue[Notice | None]) -> None:
        try:
            async for msg in requests:
                if msg.HasField("unused") and self.core.ready:
                    await self._grant_without_rank(node_id, msg.unused)
                    continue
                if not (msg.HasField("heartbeat") and self.core.ready and views.has_node(self.core.rt, node_id)):
                    continue
                epochs = tuple(msg.heartbeat.active_epochs)
                if views.heartbeat_changes_state(self.core.rt, node_id):  # LOST -> READY is stored: a transition
                    with contextlib.suppress(ServiceError):
                        await self.core.mutate(lambda rt, e=epochs: rt.heartbeat(node_id, e))
                else:  # renewals and the last-heard time live in memory only
                    self.core.rt.heartbeat(node_id, epochs)
        except (asyncio.CancelledError, grpc.RpcError):
            pass
        finally:
            outbox.put_nowait(None)  # the sidecar went away: end the stream

    async def _grant_without_rank(self, node_id: str, msg: pb.GrantWithoutRank) -> None:
        """The node's sidecar got a grant for a job with no rank there: record it (log, metric) and
        release that node of the permit on the job's behalf where the runtime can (`grant_without_rank`)."""
        try:
            outcome = await self.core.mutate(lambda rt: rt.grant_without_rank(node_id, msg.job, msg.epoch))
        except ServiceError as exc:
            log.warning("grant without rank not handled: %s", exc, extra={"job": msg.job, "node": node_id})
            return
        self.core.metrics.permit_nodes_unused.labels(outcome=outcome.value).inc()
        log.warning("job is not on a node of its permit", extra={"job": msg.job, "epoch": msg.epoch, "node": node_id,
                                                                 "outcome": outcome.value})

    @_rpc
    async def ReportAttach(self, request: pb.ReportAttachRequest, context: grpc.aio.ServicerContext) -> Any:
        node_id = self._name(request.node_id, "node_id")
        self.auth.check_node(bearer(context.invocation_metadata()), node_id)
        name = self._name(request.job, "job")
        placed, attach = await self.core.mutate(lambda rt: rt.report_attach(name, node_id))
        log.info("job rank attached", extra={"job": name, "node": node_id, "placement": ",".join(placed)})
        return pb.ReportAttachResponse(placement_nodes=placed, attach_nodes=attach)

    # ------------------------------------------------------------------------------------------
    # job side
    # ------------------------------------------------------------------------------------------
    def _registrar(self, request: pb.RegisterJobRequest, context: grpc.aio.ServicerContext) -> str:
        """Authenticate a registration: the operator's, or one relayed by a registered node's sidecar
        (its node token). Returns the relaying node ("" = direct)."""
        token = bearer(context.invocation_metadata())
        if not request.relay_node:
            self.auth.check_operator(token)
            return ""
        node_id = self._name(request.relay_node, "relay_node")
        self.auth.check_node(token, node_id)
        if not self.core.config.relayed_registration:
            raise PermissionDeniedError(f"node {node_id!r} relayed a job registration, but this coordinator "
                                        "refuses relayed registrations (--no-relayed-registration): register "
                                        "the job with the operator token instead")
        self.core.require_ready()
        views.node(self.core.rt, node_id)
        return node_id

    @_rpc
    async def RegisterJob(self, request: pb.RegisterJobRequest, context: grpc.aio.ServicerContext) -> Any:
        relayed_by = self._registrar(request, context)
        if not request.HasField("spec"):
            raise InvalidArgumentError("spec is missing: expected a JobSpec")
        self._name(request.spec.name, "spec.name")
        if len(request.nonce) > 256:
            raise InvalidArgumentError("nonce is longer than 256 characters")
        spec = convert.spec_from_pb(request.spec)
        try:
            spec = self.resolve(spec)
            spec.validate_for(self.core.cluster)
        except SpecError as exc:
            raise InvalidArgumentError(str(exc)) from None
        token = new_token()
        nonce = request.nonce or new_token()
        job, how = await self.core.mutate(lambda rt: rt.register_job(
            spec, token_sha256=sha256_hex(token), nonce_sha256=sha256_hex(nonce), relayed_by=relayed_by,
            attachable=request.attachable and not relayed_by))
        log.info("job registered%s", _REGISTERED_HOW[how],
                 extra={"job": spec.name, "group": job.group_id, "state": job.state.value,
                        "relayed_by": relayed_by})
        return pb.RegisterJobResponse(job_token=token,
                                      status=convert.job_info_to_pb(views.job_status(self.core.rt, spec.name)))

    @_rpc
    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        return convert.job_info_to_pb(views.job_status(self.core.rt, name))

    def _wait_budget(self, timeout_s: float, context: grpc.aio.ServicerContext) -> float:
        """The server-side wait a call may make: its ask, the server maximum and the RPC deadline."""
        wait_s = min(validate.timeout(timeout_s), self.core.config.max_wait_s)
        remaining_rpc = context.time_remaining()
        if remaining_rpc is not None:
            wait_s = min(wait_s, max(0.0, remaining_rpc - 0.05))
        return wait_s

    async def _await_grant(self, name: str, phase: Phase, iteration: int, wait_s: float, start: float,
                           permit: PermitRecord | None = None, *, asked: bool = False,
                           held: bool = False) -> pb.AcquirePermitResponse:
        """Ask for `phase` of `iteration` until granted (durably), the wait ends or the job goes.

        Args:
            permit / asked: the answer of an ask the caller already made in its own transition.
            held: the caller released its node of the previous phase while other nodes still hold it:
                the ask is out of order until they release, and is retried (every `_HELD_POLL_S`).
        """
        core = self.core
        deadline = start + wait_s
        while True:
            if not asked:
                if views.job(core.rt, name) is None:
                    return pb.AcquirePermitResponse(outcome=pb.WAIT_OUTCOME_JOB_REMOVED,
                                                    waited_s=core.clock() - start,
                                                    reason=f"job {name!r} was removed while waiting")
                try:
                    permit = await core.mutate(lambda rt: rt.acquire(name, phase, iteration))
                except OutOfOrderError:
                    if not (held or _follows_held(views.permit(core.rt, name), phase, iteration)):
                        raise
                    permit = None  # the previous phase is still held (here or on other nodes): its release wakes us
            asked = False
            if permit is not None and permit.state is PermitState.GRANTED:
                await core.grant_durable(name)  # only hand out a grant the store holds
                return pb.AcquirePermitResponse(outcome=pb.WAIT_OUTCOME_GRANTED, waited_s=core.clock() - start,
                                                lease=convert.lease_to_pb(permit.to_lease(core.config.lease_ttl_s)))
            remaining = deadline - core.clock()
            if remaining <= 0:
                return pb.AcquirePermitResponse(outcome=pb.WAIT_OUTCOME_TIMEOUT, waited_s=core.clock() - start,
                                                reason=f"waited {wait_s:.3g}s: {views.wait_reason(core.rt, name)}")
            event = core.job_event(name)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=min(remaining, _HELD_POLL_S) if held else remaining)

    @_rpc
    async def AcquirePermit(self, request: pb.AcquirePermitRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        phase = convert.phase_from_pb(request.phase)
        if request.iteration < 0:
            raise InvalidArgumentError(f"iteration={request.iteration} is invalid: expected >= 0")
        wait_s = self._wait_budget(request.timeout_s, context)
        return await self._await_grant(name, phase, request.iteration, wait_s, self.core.clock())

    @_rpc
    async def RenewPermit(self, request: pb.RenewPermitRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        epoch = self._epoch(request.epoch)
        ttl = await self.core.mutate(lambda rt: rt.renew(name, epoch))
        return pb.RenewPermitResponse(ttl_s=ttl)

    @_rpc
    async def ReleasePermit(self, request: pb.ReleasePermitRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        epoch = self._epoch(request.epoch)
        self._duration(name, epoch, request.duration_s)
        permit = views.permit(self.core.rt, name)
        pool = self._pools[permit is not None and permit.phase is Phase.ROLLOUT]
        node_id = self._name(request.node_id, "node_id") if request.node_id else ""
        res = await self.core.mutate(lambda rt: rt.release(name, epoch, request.duration_s, node_id=node_id))
        if res.already_released:
            await self.core.barrier()
        elif not res.held_nodes:  # the permit ended (a node of one that goes on is no release of it)
            pool.inc()
        return pb.ReleasePermitResponse(next_phase=convert.PHASE_TO_PB[res.next_phase],
                                        next_iteration=res.next_iteration, already_released=res.already_released,
                                        held_nodes=res.held_nodes)

    @_rpc
    async def AdvancePermit(self, request: pb.AdvancePermitRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        epoch = self._epoch(request.epoch)
        self._duration(name, epoch, request.duration_s)
        wait_s = self._wait_budget(request.timeout_s, context)
        core = self.core
        start = core.clock()
        permit = views.permit(core.rt, name)
        pool = self._pools[permit is not None and permit.phase is Phase.ROLLOUT]
        node_id = self._name(request.node_id, "node_id") if request.node_id else ""
        res, nxt = await core.mutate(lambda rt: rt.advance(name, epoch, request.duration_s, node_id=node_id))
        if not res.already_released and not res.held_nodes:
            pool.inc()
        released = pb.ReleasePermitResponse(next_phase=convert.PHASE_TO_PB[res.next_phase],
                                            next_iteration=res.next_iteration,
                                            already_released=res.already_released, held_nodes=res.held_nodes)
        nxt_msg = await self._await_grant(name, res.next_phase, res.next_iteration, wait_s, start, nxt,
                                          asked=not res.held_nodes, held=bool(res.held_nodes))
        return pb.AdvancePermitResponse(released=released, next=nxt_msg)

    @_rpc
    async def ReportProgress(self, request: pb.ReportProgressRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        epoch = self._epoch(request.epoch)
        decision = await self.core.mutate(lambda rt: rt.report_progress(name, epoch, request.finished, request.total))
        resp = pb.ReportProgressResponse(ttl_s=self.core.config.lease_ttl_s)
        if decision is not None:
            log.info("long-tail migration", extra={"job": name, "epoch": epoch,
                                                   "release": ",".join(decision.release_nodes)})
            resp.migrate.CopyFrom(convert.migration_to_pb(decision))
        return resp

    @_rpc
    async def AckRelocation(self, request: pb.AckRelocationRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        epoch = self._epoch(request.epoch)
        rec, note = await self.core.mutate(lambda rt: rt.ack_relocation(name, epoch))
        await self.core.barrier()  # a retried ack (nothing changed) still answers only what is stored
        log.info("relocation acknowledged", extra={"job": name, "epoch": epoch, "state": rec.state.value})
        return pb.AckRelocationResponse(directive=convert.relocation_to_pb(rec.to_model()), note=note)

    @_rpc
    async def DeregisterJob(self, request: pb.DeregisterJobRequest, context: grpc.aio.ServicerContext) -> Any:
        name = self._job(context, request.job)
        released = await self.core.mutate(lambda rt: rt.remove_job(name, reason="deregistered"))
        log.info("job deregistered", extra={"job": name})
        return pb.DeregisterJobResponse(released_nodes=released)

    # ------------------------------------------------------------------------------------------
    # operator side
    # ------------------------------------------------------------------------------------------
    @_rpc
    async def GetClusterState(self, request: pb.ClusterStateRequest, context: grpc.aio.ServicerContext) -> Any:
        self.auth.check_operator(bearer(context.invocation_metadata()))
        return convert.cluster_info_to_pb(views.cluster_state(self.core.rt, ready=self.core.ready,
                                                              fence=self.core.fence,
                                                              ttl_s=self.core.config.lease_ttl_s))

    @_rpc
    async def DrainNode(self, request: pb.DrainNodeRequest, context: grpc.aio.ServicerContext) -> Any:
        self.auth.check_operator(bearer(context.invocation_metadata()))
        node_id = self._name(request.node_id, "node_id")
        state = await self.core.mutate(lambda rt: rt.drain_node(node_id))
        log.info("node drain", extra={"node": node_id, "state": state.value})
        return pb.DrainNodeResponse(state=state.value)

    @_rpc
    async def RemoveJob(self, request: pb.RemoveJobRequest, context: grpc.aio.ServicerContext) -> Any:
        self.auth.check_operator(bearer(context.invocation_metadata()))
        name = self._name(request.job, "job")
        released = await self.core.mutate(lambda rt: rt.remove_job(name, reason="removed by operator"))
        log.info("job removed by operator", extra={"job": name})
        return pb.DeregisterJobResponse(released_nodes=released)


def _follows_held(permit: PermitRecord | None, phase: Phase, iteration: int) -> bool:
    """Whether (`phase`, `iteration`) is the phase right after the one `permit` holds: an ask that
    came before the job's other rank released (the rollout worker asking Rollout(i+1) as the trainer
    releases Sync(i)). It waits for that release instead of failing, so no sidecar polls for it."""
    return (permit is not None and permit.state is PermitState.GRANTED
            and next_phase(permit.phase, permit.iteration) == (phase, iteration))


__all__ = ["CoordinatorServicer", "NodeState"]
