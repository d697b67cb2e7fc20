"""The scheduling loop: pending gangs in, the coordinator's placement out, as Bindings, all or nothing.

One cycle reads as five steps (Kueue's ``schedule()`` is the model): snapshot the cache, group the
pending pods into gangs, build each complete gang's job spec, ask the coordinator to admit and place the
job (the same policy it runs for every job), then bind every pod of the gang to its node, or leave them
all pending and say why. The pure parts (`gang`, `spec`, `assign`, `nodefilter`) decide; this module
only reads, calls and writes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rollmux.core.model import JobInfo, Pool
from rollmux.k8s import assign, explain, gang, objects
from rollmux.k8s.api import (
    SCHEDULER_NAME,
    Binding,
    Code,
    Conventions,
    Gang,
    GangDecision,
    NodeUsage,
    NodeView,
    Owner,
    PodView,
    SchedulerError,
)
from rollmux.k8s.cache import ClusterCache, Informer
from rollmux.k8s.explain import Explainer
from rollmux.k8s.kube import KubeClient, KubeError
from rollmux.k8s.leader import LeaderElector, LeaseConfig
from rollmux.k8s.metrics import SchedulerMetrics
from rollmux.k8s.spec import GangSpec, gang_spec
from rollmux.k8s.usage import add_pod, usage
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, ServiceError

log = logging.getLogger("rollmux.k8s")

OWNER_PATHS = {  # controller kind -> API path of its collection (namespaced)
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
    "RayCluster": "/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}",
    "RayJob": "/apis/ray.io/v1/namespaces/{ns}/rayjobs/{name}",
    "PodGroup": "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    scheduler_name: str = SCHEDULER_NAME  # the pods' spec.schedulerName this scheduler owns
    resync_s: float = 1.0  # a waiting gang is looked at again this often (the queue moves), sooner if its pods change
    watch_timeout_s: int = 60  # a watch is renewed this often
    conventions: Conventions = field(default_factory=Conventions)  # GPU resource and pool label names
    gang_timeout_s: float = 300.0  # a placed gang not whole this long: its bound pods are evicted, its placement freed
    release_grace_s: float = 30.0  # a job it registered whose pods are all gone this long, no driver attached: removed
    namespaces: tuple[str, ...] = ()  # the namespaces it serves (empty: every one)
    lease: LeaseConfig | None = None  # leader election among replicas (None: this one always leads)


_REASONS = {Code.UNSCHEDULABLE: explain.UNSCHEDULABLE, Code.REFUSED: explain.UNSCHEDULABLE,
            Code.GATED: explain.GATED}
"""The PodScheduled reason per waiting code: `Unschedulable` only where a node is short of something."""


def condition_reason(code: Code | None) -> str:
    return _REASONS.get(code, explain.WAITING) if code is not None else explain.WAITING


class Scheduler:
    """A secondary Kubernetes scheduler for RollMux job pods.

    Args:
        kube: the API server.
        coordinator: the coordinator, with the operator token (it registers jobs on their behalf).
        config: knobs.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(self, kube: KubeClient, coordinator: CoordinatorClient, config: SchedulerConfig | None = None,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.coordinator = kube, coordinator
        self.config = config or SchedulerConfig()
        self.conv = self.config.conventions
        self.clock = clock
        self.cache = ClusterCache(self.conv)
        self.metrics = SchedulerMetrics.create()
        self.explainer = Explainer(kube, self.config.scheduler_name)
        self.stop_event = threading.Event()
        self._informers: list[Informer] = []
        # jobs this scheduler registered (or found registered) -> the (rollout, train) GPUs it registered
        # them for (None: found, shape unknown)
        self._registered: dict[str, tuple[int, int] | None] = {}
        self._complete_since: dict[tuple[str, str], float] = {}  # gang -> when it was first complete
        self._placed_since: dict[tuple[str, str], float] = {}  # gang -> when it was first placed, not whole
        self._gone_since: dict[str, float] = {}  # a registered job with no pod left -> since when
        self._drained: set[str] = set()  # nodes this scheduler drained at the coordinator (cordoned, gone)
        self._refused: dict[tuple[str, str], tuple[frozenset[str], str]] = {}  # gang -> (pod uids, why) refused
        # a gang that waits -> (when to look at it again, its pending pods then): a cycle woken by another
        # gang's pods skips it, so N waiting gangs do not slow every placement down
        self._next_look: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        self.last_cycle_at = clock()  # the watchdog's view of the scheduling loop
        self.elector = (LeaderElector(kube, self.config.lease, self.stop_event) if self.config.lease is not None
                        else None)

    # ------------------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 30.0) -> Scheduler:
        """Start the pod and node informers and wait for their first lists."""
        c = self.cache
        self._informers = [
            Informer(self.kube, "/api/v1/pods", c.replace_pods, c.apply_pod, self.stop_event,
                     watch_timeout_s=self.config.watch_timeout_s),
            Informer(self.kube, "/api/v1/nodes", c.replace_nodes, c.apply_node, self.stop_event,
                     watch_timeout_s=self.config.watch_timeout_s),
        ]
        for inf in self._informers:
            inf.start()
        deadline = time.monotonic() + timeout_s
        for inf in self._informers:
            if not inf.synced.wait(max(deadline - time.monotonic(), 0.0)):
                raise KubeError(0, f"could not list {inf.path} within {timeout_s:g} s")
        if self.elector is not None:
            self.elector.start()
        return self

    @property
    def leading(self) -> bool:
        """May this replica bind now (it holds the Lease, or runs without leader election)?"""
        return self.elector is None or self.elector.leading.is_set()

    def run(self) -> None:
        """Cycle until `stop()`: on every change the watches report, and every `resync_s`."""
        while not self.stop_event.is_set():
            self.cache.changed.wait(self.config.resync_s)
            self.cache.changed.clear()
            if self.stop_event.is_set():
                return
            self.last_cycle_at = self.clock()
            self.metrics.leader.set(1 if self.leading else 0)
            if not self.leading:  # a standby: its cache stays warm, it decides nothing
                continue
            try:
                self.cycle()
            except (KubeError, ServiceError) as exc:  # broken infra: log, retry next cycle
                log.warning("scheduling cycle failed: %s", exc)
            self.last_cycle_at = self.clock()

    def stop(self) -> None:
        self.stop_event.set()
        self.cache.changed.set()
        if self.elector is not None and self.elector.is_alive():
            self.elector.join(5)

    def health(self) -> str:
        """Why the scheduler is not healthy ("" when it is): an informer thread died or stalled past its
        watch timeout, or the loop has not cycled for a while. /livez and /readyz answer with it."""
        now, stall = self.clock(), self.config.watch_timeout_s + 30.0
        for inf in self._informers:
            if not inf.is_alive():
                return f"informer {inf.path} stopped"
            if not inf.synced.is_set():
                return f"informer {inf.path} has not listed yet"
            if now - inf.alive_at > stall:
                return f"informer {inf.path} made no progress for {now - inf.alive_at:.0f} s"
        if not self._informers:
            return "not started"
        if now - self.last_cycle_at > max(10 * self.config.resync_s, stall):
            return f"no scheduling cycle for {now - self.last_cycle_at:.0f} s"
        return ""

    # ------------------------------------------------------------------------------ one cycle
    def cycle(self) -> list[GangDecision]:
        """One pass over every pending gang, by priority then age; returns what was decided for each
        complete one. One gang's failure (a refused Binding, an API error) is its own: the cycle goes on."""
        t0 = time.perf_counter()
        # 1. snapshot
        pods, nodes, unparsable = self.cache.snapshot()
        mine = [p for p in pods if p.scheduler_name == self.config.scheduler_name and not p.deleting]
        pending = [p for p in mine if not p.node_name]
        for obj, why in unparsable:
            if (obj.get("spec") or {}).get("schedulerName") == self.config.scheduler_name:
                spec = {**obj["spec"], "containers": [], "initContainers": [], "overhead": {}}  # its identity
                self._tell_bad(objects.pod_view({**obj, "spec": spec}, self.conv), why)
        # 2. gangs (pods that name no valid job wait with an event)
        groups, bad = gang.group_pending(pending)
        for pod, why in bad:
            self._tell_bad(pod, why)
        bound: dict[tuple[str, str], list[PodView]] = {}
        for p in mine:
            if p.node_name and p.job:
                bound.setdefault((p.namespace, p.job), []).append(p)
        decisions: list[GangDecision] = []
        cluster_jobs: dict[str, JobInfo] = {}  # the coordinator's jobs, read at most once a cycle (when needed)
        owner_sizes: dict[tuple[str, str, str], int] = {}
        for memo in (self._complete_since, self._placed_since, self._next_look, self._refused):
            for gone in set(memo) - set(groups):  # forget gangs that are no longer pending
                del memo[gone]
        used = usage(pods, nodes, self._job_of)  # kept up to date below as gangs bind
        node_pools = {name: n.pool for name, n in nodes.items()}  # for the pods already bound
        now = self.clock()
        for (ns, job), members in sorted(groups.items(), key=lambda kv: (*gang.order_key(kv[1]), kv[0])):
            try:
                decision = self._gang(ns, job, members, bound.get((ns, job), []), nodes, node_pools, used,
                                      cluster_jobs, owner_sizes, now)
            except (KubeError, ServiceError) as exc:  # this gang's: the others go on
                log.warning("job %s/%s: %s", ns, job, exc)
                self._next_look.pop((ns, job), None)
                continue
            if decision is not None:
                decisions.append(decision)
        try:
            self._release_gone(mine, cluster_jobs, now)
        except ServiceError as exc:
            log.warning("releasing jobs whose pods are gone: %s", exc)
        self.metrics.pending_gangs.set(len(groups))
        self.explainer.forget({p.uid for p in pending})
        self.metrics.cycle_seconds.observe(time.perf_counter() - t0)
        return decisions

    def _gang(self, ns: str, job: str, members: list[PodView], siblings: list[PodView], nodes: dict[str, NodeView],
              node_pools: dict[str, Pool | None], used: dict[str, NodeUsage], cluster_jobs: dict[str, JobInfo],
              owner_sizes: dict[tuple[str, str, str], int], now: float) -> GangDecision | None:
        key = (ns, job)
        uids = frozenset(p.uid for p in members)
        seen = self._next_look.get(key)
        if seen is not None and seen[1] == uids and now < seen[0]:
            return None  # it waits, and its pods did not change: looked at again after resync_s
        self._next_look[key] = (now + self.config.resync_s, uids)
        if self.config.namespaces and ns not in self.config.namespaces:
            self._tell_all(members, code=None, message=f"waiting: namespace {ns} is not among the "
                                                                 "namespaces this scheduler serves")
            return None
        gated = [p for p in members if p.gates]
        if gated:  # e.g. Kueue holds it: not registered, not bound, until every gate is lifted
            self.metrics.gangs.labels(outcome=Code.GATED.value).inc()
            self._tell_all(members, code=Code.GATED, message=f"waiting: pod {gated[0].name} has scheduling gates "
                                                               f"({', '.join(gated[0].gates)}); the gang binds once "
                                                               "every gate is lifted")
            return None
        name = self.conv.qualified(ns, job)
        try:
            if len(name) > gang.MAX_NAME_LEN:
                raise SchedulerError(Code.BAD_INPUT, f"namespace and job name {name!r} are longer than "
                                                     f"{gang.MAX_NAME_LEN} characters together: shorten the job's")
            g = gang.build_gang(ns, job, members + siblings, lambda n, o: self._owner_size(n, o, owner_sizes),
                                name=name)
        except SchedulerError as exc:
            self._tell_all(members, code=exc.reason, message=f"waiting: {exc}")
            return None
        if not g.complete:
            self._complete_since.pop(key, None)
            self.metrics.gangs.labels(outcome=Code.INCOMPLETE.value).inc()
            self._tell_all(members, code=Code.INCOMPLETE, message=f"waiting: {len(g.pods)}/{g.size} pods of "
                                                                   f"job {job!r} exist; the gang binds together")
            return None
        self._complete_since.setdefault(key, now)
        decision = self._decide(g, nodes, node_pools, used, cluster_jobs)
        # 5. bind, or say why not
        if decision.bound and not self.leading:  # lost the Lease during this cycle: another replica binds
            return None
        if decision.bound:
            done, failed = self._bind(g, decision)
            for b in done:
                used[b.node] = add_pod(used.get(b.node, NodeUsage()), b.pod, name)
            if failed:  # retried next cycle, until whole or the gang timeout
                self._next_look.pop(key, None)
                self._placed_since.setdefault(key, now)
                decision = replace(decision, bindings=tuple(done), code=Code.BIND_FAILED,
                                   message=f"waiting: {len(done)}/{len(decision.bindings)} pods bound; {failed[0]}")
            else:
                self._next_look.pop(key, None)
                self._placed_since.pop(key, None)
        else:
            if decision.code in (Code.UNSCHEDULABLE, Code.MISMATCH) or any(p.node_name for p in g.pods):
                self._placed_since.setdefault(key, now)
            self._tell_all([p for p in g.pods if not p.node_name], code=decision.code, message=decision.message)
        self.metrics.gangs.labels(outcome="bound" if decision.code is None else decision.code.value).inc()
        since = self._placed_since.get(key)
        if since is not None and now - since >= self.config.gang_timeout_s:
            self._time_out(g, now - since)
        return decision

    def _decide(self, g: Gang, nodes: dict[str, NodeView], node_pools: dict[str, Pool | None], used: dict,
                cluster_jobs: dict[str, JobInfo]) -> GangDecision:
        # 3. the job's spec
        try:
            gs = gang_spec(g, node_pools)
        except SchedulerError as exc:
            return GangDecision(job=g.qualified, code=exc.reason, message=f"waiting: {exc}")
        never = assign.never_fits(gs.pools, nodes, self.conv.gpu_resource)
        if never:
            return GangDecision(job=g.qualified, code=Code.REFUSED, message=f"waiting: {never}")
        key, uids = (g.namespace, g.job), frozenset(p.uid for p in g.pods)
        refused = self._refused.get(key)
        if refused is not None and refused[0] == uids:  # the same pods again: do not ask again
            return GangDecision(job=g.qualified, code=Code.REFUSED, message=refused[1])
        # 4. admission and placement by the coordinator
        try:
            info = self._admit(gs, cluster_jobs)
        except InvalidArgumentError as exc:
            message = f"waiting: the coordinator refused job {g.qualified!r}: {exc}"
            self._refused[key] = (uids, message)
            return GangDecision(job=g.qualified, code=Code.REFUSED, message=message)
        except SchedulerError as exc:
            return GangDecision(job=g.qualified, code=exc.reason, message=f"waiting: {exc}")
        except ServiceError as exc:
            return GangDecision(job=g.qualified, code=Code.COORDINATOR, message=f"waiting: coordinator: {exc}")
        defaults = f" (profiler defaults for {', '.join(gs.defaults)})" if gs.defaults else ""
        if info.state != "admitted":
            return GangDecision(job=g.qualified, code=Code.QUEUED, defaults=gs.defaults,
                                message=f"waiting: position {info.pending_position} in the coordinator's admission "
                                        f"queue: {info.placement or 'no free nodes hold its placement yet'}{defaults}")
        placed = {Pool.ROLLOUT: info.rollout_nodes, Pool.TRAIN: info.train_nodes}
        where = ", ".join(dict.fromkeys([*info.train_nodes, *info.rollout_nodes]))
        explain_ = f"placed in group {info.group_id} on {where}: {info.placement or 'the coordinator placed it'}"
        decision = assign.assign(g.qualified, gs.pools, placed, nodes, used, explain=explain_ + defaults,
                                 gpu_resource=self.conv.gpu_resource)
        if decision.code is Code.UNSCHEDULABLE:
            decision = self._report_refusals(g, gs, info, placed, nodes, cluster_jobs, decision)
        return decision

    def _report_refusals(self, g: Gang, gs: GangSpec, info: JobInfo, placed: dict[Pool, tuple[str, ...]],
                         nodes: dict[str, NodeView], cluster_jobs: dict[str, JobInfo],
                         decision: GangDecision) -> GangDecision:
        """A placed node Kubernetes refuses for every pod: a cordoned or deleted one is drained at the
        coordinator (it places nothing there any more) and the job, still unattached, is placed again."""
        drained = []
        for r in assign.refusals(gs.pools, placed, nodes):
            node = nodes.get(r.node)
            if node is not None and not node.unschedulable:
                continue  # NotReady, a taint: it may pass; the gang waits (and times out)
            if r.node not in self._drained:
                with contextlib.suppress(NotFoundError):  # not a node the coordinator knows
                    self.coordinator.drain_node(r.node)
                self._drained.add(r.node)
                log.info("node %s is %s in Kubernetes: drained at the coordinator", r.node,
                         "cordoned" if node is not None else "gone")
            drained.append(r.node)
        if not drained or info.relayed_by or g.qualified not in self._registered \
                or any(p.node_name for p in g.pods):
            return decision
        self.coordinator.remove_job(g.qualified)
        self._registered.pop(g.qualified, None)
        cluster_jobs.pop(g.qualified, None)
        self._next_look.pop((g.namespace, g.job), None)  # placed again next cycle
        return replace(decision, message=f"{decision.message}; node(s) {', '.join(drained)} refused by Kubernetes "
                                         "were drained at the coordinator, which places the job again")

    def _admit(self, gs: GangSpec, cluster_jobs: dict[str, JobInfo]) -> JobInfo:
        """The job as the coordinator placed it: registered on its behalf now, or found registered (and
        then checked against the gang's shape). `cluster_jobs` is this cycle's read of the coordinator's
        jobs, filled on first need.

        Raises:
            SchedulerError: MISMATCH, a registration made for another shape of gang.
        """
        name = gs.spec.name
        shape = (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus)
        if name in self._registered and not cluster_jobs:
            self._read_jobs(cluster_jobs)
        if name in cluster_jobs:
            self._check_shape(gs, cluster_jobs[name])
            return cluster_jobs[name]
        try:
            with self.metrics.admit_seconds.time():
                handle = self.coordinator.register_job(gs.spec, attachable=True)
        except AlreadyExistsError:  # registered before (by a restarted scheduler, or before a relocation)
            if name not in self._read_jobs(cluster_jobs):
                raise
            self._registered.setdefault(name, None)
            self._check_shape(gs, cluster_jobs[name])
            return cluster_jobs[name]
        self._registered[name] = shape
        assert handle.registration is not None
        return handle.registration

    def _check_shape(self, gs: GangSpec, info: JobInfo) -> None:
        """A reused registration must be the gang's: the GPUs it was registered for, where known, else
        room for the gang's GPUs on the nodes it was placed on."""
        name, shape = gs.spec.name, (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus)
        known = self._registered.get(name)
        why = ""
        if known is not None and known != shape:
            why = f"registered for {known[0]} rollout and {known[1]} training GPUs"
        elif known is None and info.state == "admitted":
            want = {pool: sum(p.gpus for p, q in gs.pools if q is pool) for pool in Pool}
            have = {Pool.ROLLOUT: sum(self._node_gpus.get(n, 0) for n in info.rollout_nodes),
                    Pool.TRAIN: sum(self._node_gpus.get(n, 0) for n in info.train_nodes)}
            short = (sum(want.values()) > sum(have.values()) if not (have[Pool.ROLLOUT] and have[Pool.TRAIN])
                     else any(want[p] > have[p] for p in Pool))
            if short:
                why = (f"placed on nodes with {have[Pool.ROLLOUT]} rollout and {have[Pool.TRAIN]} training GPUs, "
                       f"fewer than its pods request")
        if why:
            raise SchedulerError(Code.MISMATCH, f"job {name!r} is already registered at the coordinator, {why}; "
                                                f"its pods ask for {shape[0]} and {shape[1]}: not bound. Remove the "
                                                "registration (rollmux remove-job) or rename the job")

    def _bind(self, g: Gang, decision: GangDecision) -> tuple[list[Binding], list[str]]:
        """Bind each pod of the decision (the Binding carries the pod's UID, so a pod replaced under the
        same name is never bound in its stead); returns the bindings the API server took and why the
        others failed."""
        done: list[Binding] = []
        failed: list[str] = []
        for b in decision.bindings:
            body = {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": b.pod.name, "namespace": b.pod.namespace, "uid": b.pod.uid},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": b.node}}
            try:
                self.kube.create(f"/api/v1/namespaces/{b.pod.namespace}/pods/{b.pod.name}/binding", body)
            except KubeError as exc:  # its own: the gang is retried, the cycle goes on
                outcome = "conflict" if exc.status in (404, 409) else "error"
                self.metrics.bindings.labels(outcome=outcome).inc()
                why = f"binding pod {b.pod.name} to {b.node} failed ({exc})"
                log.info("job %s: %s", g.qualified, why)
                failed.append(why)
                if exc.status not in (404, 409):
                    self.explainer.tell(b.pod, placed=False, reason=explain.WAITING,
                                        message=f"waiting: {why}; retried until the gang is whole or "
                                                f"{self.config.gang_timeout_s:g} s pass")
                continue
            done.append(b)
            self.cache.assume(b.pod, b.node)
            self.metrics.bindings.labels(outcome="ok").inc()
            self.explainer.tell(b.pod, placed=True, message=decision.message)
        since = self._complete_since.pop((g.namespace, g.job), None) if not failed else None
        if since is not None:
            self.metrics.gang_latency.observe(self.clock() - since)
        log.info("job %s: bound %d/%d pods: %s", g.qualified, len(done), len(decision.bindings), decision.message)
        return done, failed

    def _time_out(self, g: Gang, waited_s: float) -> None:
        """The gang was placed but is not whole after the gang timeout: evict its bound pods (their
        controller makes new ones) and free its placement at the coordinator while no driver holds it."""
        evicted = []
        for p in g.pods:
            if p.node_name:
                try:
                    self._evict(p)
                    evicted.append(p.name)
                except KubeError as exc:
                    log.warning("job %s: evicting %s: %s", g.qualified, p.key, exc)
        released = ""
        if g.qualified in self._registered:
            info = {j.job: j for j in self.coordinator.cluster_state().jobs}.get(g.qualified)
            if info is not None and not info.relayed_by:
                self.coordinator.remove_job(g.qualified)
                released = "; its placement at the coordinator is released"
            self._registered.pop(g.qualified, None)
        key = (g.namespace, g.job)
        for memo in (self._placed_since, self._complete_since, self._next_look):
            memo.pop(key, None)
        self.metrics.gangs.labels(outcome=Code.TIMEOUT.value).inc()
        message = (f"waiting: gang timeout: job {g.job!r} was not whole {waited_s:.0f} s after it was placed "
                   f"(limit {self.config.gang_timeout_s:g} s); evicted its bound pods "
                   f"({', '.join(evicted) or 'none'}){released}")
        log.warning("job %s: %s", g.qualified, message)
        self._tell_all([p for p in g.pods if not p.node_name], code=Code.TIMEOUT, message=message)

    def _evict(self, pod: PodView) -> None:
        """The Eviction API (PodDisruptionBudgets hold), policy/v1 where served, else policy/v1beta1 (a
        server without policy/v1 answers 400 or 404; a pod gone meanwhile is 404 to both)."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction"
        for version in ("policy/v1", "policy/v1beta1"):
            body = {"apiVersion": version, "kind": "Eviction",
                    "metadata": {"name": pod.name, "namespace": pod.namespace},
                    "deleteOptions": {"preconditions": {"uid": pod.uid}}}
            try:
                self.kube.create(path, body)
                return
            except KubeError as exc:
                if exc.status not in (400, 404):
                    raise
        # 404 to both: gone already

    def _release_gone(self, mine: list[PodView], cluster_jobs: dict[str, JobInfo], now: float) -> None:
        """Deregister a job this scheduler registered whose pods are all gone (a deleted Job, pods that
        never started) for `release_grace_s`, unless its driver took the registration over."""
        alive = {self.conv.qualified(p.namespace, p.job) for p in mine if p.job}
        for name in list(self._registered):
            if name in alive:
                self._gone_since.pop(name, None)
                continue
            since = self._gone_since.setdefault(name, now)
            if now - since < self.config.release_grace_s:
                continue
            if not cluster_jobs:
                self._read_jobs(cluster_jobs)
            info = cluster_jobs.get(name)
            if info is not None and not info.relayed_by:
                self.coordinator.remove_job(name)
                log.info("job %s: every pod gone for %.0f s before a driver attached: deregistered", name, now - since)
            self._registered.pop(name, None)
            self._gone_since.pop(name, None)
        for gone in set(self._gone_since) - set(self._registered):
            del self._gone_since[gone]

    # ------------------------------------------------------------------------------ helpers
    def _job_of(self, pod: PodView) -> str:
        return self.conv.qualified(pod.namespace, pod.job) if pod.job else ""

    def _read_jobs(self, into: dict[str, JobInfo]) -> dict[str, JobInfo]:
        state = self.coordinator.cluster_state()
        into.clear()
        into.update((j.job, j) for j in state.jobs)
        self._node_gpus = {n.node_id: n.gpu_count for n in state.nodes}
        return into

    _node_gpus: dict[str, int] = {}  # noqa: RUF012 (replaced, never mutated): the coordinator's GPUs per node

    def _owner_size(self, ns: str, owner: Owner, memo: dict[tuple[str, str, str], int]) -> int:
        key = (ns, owner.kind, owner.name)
        if key not in memo:
            path = OWNER_PATHS.get(owner.kind)
            if path is None:
                return objects.owner_gang_size(owner.kind, {})  # raises: unknown kind
            try:
                memo[key] = objects.owner_gang_size(owner.kind, self.kube.get(path.format(ns=ns, name=owner.name)))
            except KubeError as exc:
                raise SchedulerError(Code.BAD_INPUT, f"cannot read the pods' {owner.kind} {ns}/{owner.name} to "
                                                     f"size the gang ({exc}): annotate them with "
                                                     "rollmux.io/gang-size") from None
        return memo[key]

    def _tell_bad(self, pod: PodView, why: str) -> None:
        self.explainer.tell(pod, placed=False, message=f"waiting: {why}", reason=explain.WAITING)

    def _tell_all(self, pods: list[PodView], *, code: Code | None, message: str) -> None:
        for pod in pods:
            self.explainer.tell(pod, placed=False, message=message, reason=condition_reason(code))
