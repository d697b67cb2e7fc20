"""The coordinator's imperative shell: leadership, load, commit, notify, expire, recover.

`Coordinator` owns one `Runtime` (all state, no I/O) and runs every transition as four steps:
1. check that it is ready (leader, store reachable, state loaded);
2. decide and apply in memory (`Runtime` validates before it changes anything);
3. persist the changed records through the ordered group `Committer` (one atomic store commit);
4. deliver the runtime's notices to node streams and waiting jobs.
If a commit fails, the coordinator turns not-ready, drops its in-memory state and reloads it from
the store once the store answers again (and it still leads), so memory never runs ahead of what is
durable for long, and nothing is granted that the store does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.api import PlacementPolicy
from rollmux.coordinator.service.committer import Committer
from rollmux.coordinator.service.metrics import Metrics, create_metrics
from rollmux.coordinator.service.runtime import Notice, NoticeKind, Runtime
from rollmux.coordinator.service.runtime.api import (
    NodeState,
    NotReadyError,
    PermitState,
    ServiceConfig,
    ServiceError,
    StaleFenceError,
    StoreError,
)
from rollmux.coordinator.service.runtime.state import live_policy_config
from rollmux.coordinator.service.store import Store
from rollmux.core.model import ClusterSpec, Phase, Pool

log = logging.getLogger("rollmux.coordinator")
T = TypeVar("T")

GAUGE_SLICE = 64
"""Items the gauge pass handles between two yields to the event loop. In one pass, at 2,000 jobs
(4,000 nodes, 2,000 groups) it took about 11 ms (py-spy), a stall of every call in flight; in slices
of 256 (~1.3 ms each) a permit call still came out 5-10 ms late once a second: a call crosses the
loop several times (request, commit, Redis reply, answer) and may wait behind a slice at each."""
GAUGE_INTERVAL_S = 5.0
"""How often the gauges are refreshed (and bubble seconds accumulated): Prometheus scrapes every
15-60 s, so a pass a second bought nothing and cost a burst of late calls each time."""


REPLAN_INTERVAL_S = 0.25
"""Shortest wait between two searches of the paced planner (`Coordinator._replanner`)."""
REPLAN_SHARE = 0.0005
"""Most of the event loop's time the paced planner's searches may take. A search at 2,000 groups
takes ~30 ms, a stall of every call in flight (40-60 calls late by 10-55 ms in
`benchmarks/coordinator_load.py`); after one the planner waits ~60 s. A burst of learning events
(thousands of jobs started together) is therefore worked off slowly, oldest first, while an event
in a running cluster (one per job, a few iterations after it starts) is planned within a minute.
With 0.002 (a search every ~15 s) the searches alone made half the asks over 10 ms of a run (p99
11.88 ms)."""


async def _sliced(items: list[T], every: int = GAUGE_SLICE) -> AsyncIterator[T]:
    """`items`, yielding to the event loop after every `every` of them."""
    for i, item in enumerate(items):
        if i and i % every == 0:
            await asyncio.sleep(0)
        yield item


class Coordinator:
    """The live coordinator around one store.

    Args:
        store: Redis or embedded store.
        cluster: shape of nodes the policy plans with.
        config: service knobs.
        owner: this instance's name in the leadership lease (a restarted instance with the same
            name takes over at once; a standby with another name waits for the lease to lapse).
        clock: monotonic seconds (injectable for tests).
        policy: the placement policy (default: RollMux's; `rollmux.coordinator.policy.registry.create_policy` builds any by name).
    """

    def __init__(self, store: Store, *, cluster: ClusterSpec | None = None, config: ServiceConfig | None = None,
                 owner: str = "coordinator", leader_ttl_s: float = 5.0, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic, policy: PlacementPolicy | None = None) -> None:
        self.store = store
        self.cluster = cluster or ClusterSpec()
        self.config = config or ServiceConfig()
        self.owner = owner
        self.leader_ttl_s = leader_ttl_s
        self.metrics = metrics or create_metrics()
        self.clock = clock
        self.policy = policy or RollMuxPolicy(live_policy_config(self.config))
        self._commits_ok = self.metrics.store_commits.labels(outcome="ok")
        granted = self.metrics.permits_granted
        self._granted = {True: granted.labels(pool="rollout"), False: granted.labels(pool="train")}
        self.rt = Runtime(self.cluster, self.config, clock=clock, wall=time.time, policy=self.policy)
        self.fence = 0
        self.ready = False
        self.not_ready_reason = "starting"
        self.committer = Committer(store, lambda: self.fence, self._on_commit_failure)
        self._events: dict[str, asyncio.Event] = {}  # job -> woken on any change to it
        self._streams: dict[str, asyncio.Queue[Notice | None]] = {}  # node -> its stream's outbox
        self._tasks: list[asyncio.Task[None]] = []
        self._recovering: asyncio.Task[None] | None = None
        self._free_since: dict[str, float] = {}
        self._applied = 0  # transitions with writes applied in memory (in commit order)
        self._durable = 0  # the last of them known to be in the store
        self._grant_seq: dict[str, int] = {}  # job -> the transition that granted its current permit
        self.on_ready_change: Callable[[bool], None] = lambda ready: None

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start background tasks and begin (or wait for) leadership; returns at once."""
        self.committer.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._reaper(), name="rollmux-reaper"),
                       loop.create_task(self._leader_loop(), name="rollmux-leader"),
                       loop.create_task(self._gauges(), name="rollmux-gauges"),
                       loop.create_task(self._replanner(), name="rollmux-replanner")]
        self._begin_recovery("starting")

    async def wait_ready(self, timeout_s: float) -> bool:
        deadline = self.clock() + timeout_s
        while not self.ready and self.clock() < deadline:
            await asyncio.sleep(0.01)
        return self.ready

    async def stop(self) -> None:
        for t in [*self._tasks, *([self._recovering] if self._recovering else [])]:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.committer.stop()
        for q in self._streams.values():
            q.put_nowait(None)
        self._set_ready(False, "stopped")

    def _set_ready(self, ready: bool, reason: str = "") -> None:
        if ready != self.ready:
            log.info("coordinator %s", "ready" if ready else f"not ready: {reason}",
                     extra={"fence": self.fence, "owner": self.owner})
        self.ready, self.not_ready_reason = ready, reason
        self.metrics.ready.set(1 if ready else 0)
        self.on_ready_change(ready)

    def _on_commit_failure(self, exc: Exception) -> None:
        self.metrics.store_commits.labels(outcome="failed").inc()
        log.warning("state store commit failed, reloading state: %s", exc)
        self._begin_recovery(f"state store failed: {exc}")

    def _begin_recovery(self, reason: str) -> None:
        self._set_ready(False, reason)
        if self._recovering is None or self._recovering.done():
            self._recovering = asyncio.get_running_loop().create_task(self._recover(), name="rollmux-recover")

    async def _recover(self) -> None:
        """Become leader, reload state from the store, reconnect open streams; retry with backoff."""
        delay = 0.05
        while True:
            try:
                await self.committer.stop()
                fence = await self.store.acquire_leadership(self.owner, self.leader_ttl_s)
                if fence is None:
                    self.not_ready_reason = "standby: another coordinator holds the leadership lease"
                    self._release_clients()
                else:
                    self.fence = fence
                    records = await self.store.load()
                    rt = Runtime.from_records(records, self.cluster, self.config, clock=self.clock, wall=time.time,
                                              policy=self.policy)
                    for node_id in self._streams:
                        if node_id in rt.state.nodes:
                            rt.node_connected(node_id)
                    self.rt = rt
                    self._grant_seq.clear()  # every lease just loaded is in the store
                    self.committer.reset()
                    self.committer.start()
                    writes, notices = rt.take_changes()
                    if writes:
                        await self.committer.commit(writes)
                    self._set_ready(True)
                    log.info("state loaded: %d jobs, %d nodes, %d leases", len(rt.state.jobs), len(rt.state.nodes),
                             len(rt.leases.holder), extra={"fence": fence})
                    for node_id in self._streams:
                        self._push(node_id, Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
                        for notice in rt.directives.notices_for(node_id):  # directives survive the restart
                            self._push(node_id, notice)
                    for ev in self._events.values():
                        ev.set()
                    self._deliver(notices)
                    return
            except (StoreError, OSError, NotReadyError) as exc:
                self.not_ready_reason = f"state store unavailable: {exc}"
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _release_clients(self) -> None:
        """Standing by: end the node streams (their sidecars reconnect to the leader, which otherwise
        sees those nodes LOST for as long as this standby holds them) and wake permit waits (they
        answer UNAVAILABLE, and their clients retry at the leader)."""
        for q in self._streams.values():
            q.put_nowait(None)
        for ev in self._events.values():
            ev.set()

    async def _leader_loop(self) -> None:
        while True:
            await asyncio.sleep(self.leader_ttl_s / 3)
            if not self.ready:
                continue
            try:
                if not await self.store.renew_leadership(self.owner, self.fence, self.leader_ttl_s):
                    log.warning("leadership lost (fence %s superseded); standing by", self.fence)
                    self._begin_recovery("leadership lost to another coordinator")
            except (StoreError, OSError) as exc:
                self._begin_recovery(f"state store unavailable: {exc}")

    async def _reaper(self) -> None:
        """Expire leases and lapsed heartbeats when due.

        Deadlines only move later (renewals, heartbeats) and a new one is never earlier than now plus
        the runtime's horizon, so the earliest deadline found by one scan is a safe time for the next
        scan: the state is not rescanned on every tick (it is O(jobs + nodes)).
        """
        check_at = 0.0
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            if not self.ready:
                check_at = 0.0
                continue
            now = self.clock()
            if now < check_at:
                continue
            nxt = self.rt.next_deadline()
            if nxt is None or nxt > now:
                check_at = now + self.rt.deadline_horizon_s if nxt is None else nxt
                continue
            try:
                expired = await self.mutate(lambda rt: rt.expire())
                for job in expired:
                    self.metrics.permits_revoked.labels(reason="expired").inc()
                    log.info("lease expired", extra={"job": job})
            except ServiceError:
                pass

    async def _replanner(self) -> None:
        """Plan the moves learning events queued (`Runtime.plan_deferred`), one group at a time, paced.

        One search walks every group of the cluster (~10 ms at 2,000 groups), a stall of every call
        in flight. Learning events are rare in a running cluster (one per job, a few iterations after
        it starts), but jobs that start together learn together: at 2,000 jobs planned at once the
        searches took the loop for seconds and grants timed out. So the planner spends at most
        REPLAN_SHARE of the loop's time: after a search of d seconds it waits d / REPLAN_SHARE
        (at least REPLAN_INTERVAL_S) before the next. Departures still plan at once (`Relocations.departed`).
        """
        wait_s = REPLAN_INTERVAL_S
        while True:
            await asyncio.sleep(wait_s)
            wait_s = REPLAN_INTERVAL_S
            if not (self.ready and (self.rt.learning.rescue_due or self.rt.learning.replan)):
                continue
            t0 = time.perf_counter()
            with contextlib.suppress(ServiceError):
                await self.mutate(lambda rt: rt.plan_deferred())
            wait_s = max(REPLAN_INTERVAL_S, (time.perf_counter() - t0) / REPLAN_SHARE)

    async def _gauges(self) -> None:
        """Refresh gauges and accumulate bubble seconds every GAUGE_INTERVAL_S."""
        last = self.clock()
        while True:
            await asyncio.sleep(GAUGE_INTERVAL_S)
            now = self.clock()
            await self._refresh_gauges(now - last)
            last = now

    async def _refresh_gauges(self, dt: float) -> None:
        """One pass over the nodes, the jobs and the groups: this runs on the event loop between grants,
        so at thousands of jobs it must not walk the round-robin rings (`GrantQueues.queues`), and it yields
        every GAUGE_SLICE items (`_sliced`). Gauges are a sample, so state that moves while the pass
        yields is fine: the next pass sees it."""
        rt = self.rt
        waiting = rt.grant_queues.queued_per_node()
        qlen = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}
        ready = {Pool.ROLLOUT: 0, Pool.TRAIN: 0}
        node_states = dict.fromkeys(("ready", "lost", "draining", "drained"), 0)
        async for node_id, node in _sliced(list(rt.state.nodes.items())):
            node_states[node.state.value] = node_states.get(node.state.value, 0) + 1
            if node.state is NodeState.READY:
                ready[node.pool] += 1
            n = waiting.get(node_id, 0)
            if n:
                qlen[node.pool] += n
                if node_id not in rt.leases.holder:
                    self.metrics.bubble_seconds.labels(pool=node.pool.value).inc(dt)
        for pool in (Pool.ROLLOUT, Pool.TRAIN):
            self.metrics.queue_length.labels(pool=pool.value).set(qlen[pool])
            self.metrics.pool_nodes.labels(pool=pool.value).set(ready[pool])
        usd_per_h = 0.0
        async for group in _sliced(list(rt.state.placement.groups.values())):
            usd_per_h += group.usd_per_h
        self.metrics.provisioned_usd_per_h.set(usd_per_h)
        job_states = dict.fromkeys(("pending", "admitted"), 0)
        async for job in _sliced(list(rt.state.jobs.values())):
            job_states[job.state.value] = job_states.get(job.state.value, 0) + 1
        for state in ("pending", "admitted"):
            self.metrics.jobs.labels(state=state).set(job_states[state])
        for state in ("ready", "lost", "draining", "drained"):
            self.metrics.nodes.labels(state=state).set(node_states[state])

    # ------------------------------------------------------------------------------------------
    # transitions
    # ------------------------------------------------------------------------------------------
    def require_ready(self) -> None:
        if not self.ready:
            raise NotReadyError(f"coordinator not ready: {self.not_ready_reason}; retry with backoff")

    async def mutate(self, fn: Callable[[Runtime], T]) -> T:
        """Run one transition: decide and apply in memory, commit, then notify.

        Raises:
            ServiceError: refused by validation (nothing changed), or NotReadyError when the store failed.
        """
        self.require_ready()
        rt = self.rt
        try:
            result = fn(rt)
        except ServiceError:
            writes, _ = rt.take_changes()
            if writes:  # a refusal must not leave changes behind: treat as a bug, reload
                log.error("refused transition left %d dirty records; reloading state", len(writes))
                self._begin_recovery("inconsistent refused transition")
            raise
        writes, notices = rt.take_changes()
        if writes:
            self._applied += 1
            seq = self._applied
            for n in notices:
                if n.kind is NoticeKind.GRANTED:
                    self._grant_seq[n.job] = seq
            await self.committer.commit(writes)
            self._durable = max(self._durable, seq)
            self._commits_ok.inc()
        self._deliver(notices)
        return result

    async def barrier(self) -> None:
        """Wait until every transition applied so far is durable."""
        await self.committer.commit({})

    async def grant_durable(self, job: str) -> None:
        """Wait until the transition that granted `job`'s current permit is in the store.

        Cheaper than `barrier` under load: a grant committed long ago needs no wait at all.
        """
        if self._grant_seq.get(job, 0) > self._durable:
            await self.barrier()

    # ------------------------------------------------------------------------------------------
    # notification
    # ------------------------------------------------------------------------------------------
    def job_event(self, job: str) -> asyncio.Event:
        ev = self._events.get(job)
        if ev is None or ev.is_set():
            ev = self._events[job] = asyncio.Event()
        return ev

    def _wake(self, job: str) -> None:
        ev = self._events.pop(job, None)
        if ev is not None:
            ev.set()

    def _deliver(self, notices: list[Notice]) -> None:
        for n in notices:
            if n.kind is NoticeKind.GRANTED:
                permit = self.rt.state.permits.get(n.job)
                if permit is not None and permit.state is PermitState.GRANTED:
                    self._granted[permit.phase is Phase.ROLLOUT].inc()
                    self.metrics.grant_latency.observe(max(0.0, self.clock() - permit.grantable_at))
            if n.kind is NoticeKind.RELOCATE and (rec := self.rt.directives.relocations.get(n.job)) is not None:
                self.metrics.relocations.labels(outcome="issued" if rec.state.value == "pending"
                                                else rec.state.value).inc()
            if n.kind is NoticeKind.REVOKED and n.reason != "lease expired":
                self.metrics.permits_revoked.labels(reason="removed").inc()
            if n.job:
                self._wake(n.job)
            for node_id in n.nodes:
                self._push(node_id, n)

    def _push(self, node_id: str, notice: Notice) -> None:
        q = self._streams.get(node_id)
        if q is not None:
            q.put_nowait(notice)

    def open_stream(self, node_id: str) -> asyncio.Queue[Notice | None]:
        old = self._streams.get(node_id)
        if old is not None:
            old.put_nowait(None)  # a newer stream for the node replaces the old one
        q: asyncio.Queue[Notice | None] = asyncio.Queue()
        self._streams[node_id] = q
        q.put_nowait(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))
        for notice in self.rt.directives.notices_for(node_id):  # a reconnecting sidecar hears them again
            q.put_nowait(notice)
        return q

    def close_stream(self, node_id: str, q: asyncio.Queue[Notice | None]) -> bool:
        """Forget the stream if it is still the node's current one; True if it was."""
        if self._streams.get(node_id) is q:
            del self._streams[node_id]
            return True
        return False


__all__ = ["Coordinator", "StaleFenceError"]
