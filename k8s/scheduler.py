"""The scheduling loop: pending gangs in, the coordinator's placement out, as Bindings, all or nothing.

One cycle reads as five steps (Kueue's ``schedule()`` is the model): snapshot the cache, group the
pending pods into gangs, build each complete gang's job spec, ask the coordinator to admit and place the
job (the same policy it runs for every job), then bind every pod of the gang to its node, or leave them
all pending and say why. The pure parts (`gang`, `spec`, `assign`, `nodefilter`) decide; this module
only reads, calls and writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollmux.core.model import JobInfo, Pool
from rollmux.k8s import assign, gang, objects
from rollmux.k8s.api import (
    SCHEDULER_NAME,
    Binding,
    Code,
    Gang,
    GangDecision,
    NodeUsage,
    NodeView,
    Owner,
    PodView,
    SchedulerError,
)
from rollmux.k8s.cache import ClusterCache, Informer, add_pod, usage
from rollmux.k8s.explain import Explainer
from rollmux.k8s.kube import KubeClient, KubeError
from rollmux.k8s.metrics import SchedulerMetrics
from rollmux.k8s.spec import GangSpec, gang_spec
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import AlreadyExistsError, InvalidArgumentError, ServiceError

log = logging.getLogger("rollmux.k8s")

OWNER_PATHS = {  # controller kind -> API path of its collection (namespaced)
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
    "RayCluster": "/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}",
    "RayJob": "/apis/ray.io/v1/namespaces/{ns}/rayjobs/{name}",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    scheduler_name: str = SCHEDULER_NAME  # the pods' spec.schedulerName this scheduler owns
    resync_s: float = 1.0  # a waiting gang is looked at again this often (the queue moves), sooner if its pods change
    watch_timeout_s: int = 60  # a watch is renewed this often


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
        self.clock = clock
        self.cache = ClusterCache()
        self.metrics = SchedulerMetrics.create()
        self.explainer = Explainer(kube, self.config.scheduler_name)
        self.stop_event = threading.Event()
        self._informers: list[Informer] = []
        self._registered: set[str] = set()  # jobs this scheduler registered (or found registered)
        self._complete_since: dict[tuple[str, str], float] = {}  # gang -> when it was first complete
        self._refused: dict[tuple[str, str], tuple[frozenset[str], str]] = {}  # gang -> (pod uids, why) refused
        # a gang that waits -> (when to look at it again, its pending pods then): a cycle woken by another
        # gang's pods skips it, so N waiting gangs do not slow every placement down
        self._next_look: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}

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
        return self

    def run(self) -> None:
        """Cycle until `stop()`: on every change the watches report, and every `resync_s`."""
        while not self.stop_event.is_set():
            self.cache.changed.wait(self.config.resync_s)
            self.cache.changed.clear()
            if self.stop_event.is_set():
                return
            try:
                self.cycle()
            except (KubeError, ServiceError) as exc:  # broken infra: log, retry next cycle
                log.warning("scheduling cycle failed: %s", exc)

    def stop(self) -> None:
        self.stop_event.set()
        self.cache.changed.set()

    # ------------------------------------------------------------------------------ one cycle
    def cycle(self) -> list[GangDecision]:
        """One pass over every pending gang; returns what was decided for each complete one."""
        t0 = time.perf_counter()
        # 1. snapshot
        pods, nodes, unparsable = self.cache.snapshot()
        mine = [p for p in pods if p.scheduler_name == self.config.scheduler_name and not p.deleting]
        pending = [p for p in mine if not p.node_name]
        for obj, why in unparsable:
            if (obj.get("spec") or {}).get("schedulerName") == self.config.scheduler_name:
                spec = {**obj["spec"], "containers": [], "initContainers": []}  # its identity, to tell it
                self._tell_bad(objects.pod_view({**obj, "spec": spec}), why)
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
        for gone in set(self._complete_since) - set(groups):
            del self._complete_since[gone]
        for memo in (self._next_look, self._refused):  # forget gangs that are no longer pending
            for gone in set(memo) - set(groups):
                del memo[gone]
        used = usage(pods, nodes)  # kept up to date below as gangs bind
        node_pools = {name: n.pool for name, n in nodes.items()}  # for the pods already bound
        now = self.clock()
        for (ns, job), members in sorted(groups.items()):
            uids = frozenset(p.uid for p in members)
            seen = self._next_look.get((ns, job))
            if seen is not None and seen[1] == uids and now < seen[0]:
                continue  # it waits, and its pods did not change: looked at again after resync_s
            self._next_look[(ns, job)] = (now + self.config.resync_s, uids)
            try:
                g = gang.build_gang(ns, job, members + bound.get((ns, job), []),
                                    lambda n, o: self._owner_size(n, o, owner_sizes))
            except SchedulerError as exc:
                self._tell_all(members, placed=False, message=f"waiting: {exc}")
                continue
            if not g.complete:
                self._complete_since.pop((ns, job), None)
                self.metrics.gangs.labels(outcome=Code.INCOMPLETE.value).inc()
                self._tell_all(members, placed=False, message=f"waiting: {len(g.pods)}/{g.size} pods of "
                                                              f"job {job!r} exist; the gang binds together")
                continue
            self._complete_since.setdefault((ns, job), self.clock())
            decision = self._decide(g, nodes, node_pools, used, cluster_jobs)
            decisions.append(decision)
            # 5. bind, or say why not
            if decision.bound:
                self._next_look.pop((ns, job), None)
                for b in self._bind(g, decision):
                    used[b.node] = add_pod(used.get(b.node, NodeUsage()), b.pod)
            else:
                self._tell_all([p for p in g.pods if not p.node_name], placed=False, message=decision.message)
            self.metrics.gangs.labels(outcome="bound" if decision.bound else decision.code.value).inc()
        self.metrics.pending_gangs.set(len(groups))
        self.explainer.forget({p.uid for p in pending})
        self.metrics.cycle_seconds.observe(time.perf_counter() - t0)
        return decisions

    def _decide(self, g: Gang, nodes: dict[str, NodeView], node_pools: dict[str, Pool | None], used: dict,
                cluster_jobs: dict[str, JobInfo]) -> GangDecision:
        # 3. the job's spec
        try:
            gs = gang_spec(g, node_pools)
        except SchedulerError as exc:
            return GangDecision(job=g.job, code=exc.reason, message=f"waiting: {exc}")
        never = assign.never_fits(gs.pools, nodes)
        if never:
            return GangDecision(job=g.job, code=Code.REFUSED, message=f"waiting: {never}")
        key, uids = (g.namespace, g.job), frozenset(p.uid for p in g.pods)
        refused = self._refused.get(key)
        if refused is not None and refused[0] == uids:  # the same pods again: do not ask again
            return GangDecision(job=g.job, code=Code.REFUSED, message=refused[1])
        # 4. admission and placement by the coordinator
        try:
            info = self._admit(gs, cluster_jobs)
        except InvalidArgumentError as exc:
            message = f"waiting: the coordinator refused job {g.job!r}: {exc}"
            self._refused[key] = (uids, message)
            return GangDecision(job=g.job, code=Code.REFUSED, message=message)
        except ServiceError as exc:
            return GangDecision(job=g.job, code=Code.COORDINATOR, message=f"waiting: coordinator: {exc}")
        defaults = f" (profiler defaults for {', '.join(gs.defaults)})" if gs.defaults else ""
        if info.state != "admitted":
            return GangDecision(job=g.job, code=Code.QUEUED, defaults=gs.defaults,
                                message=f"waiting: position {info.pending_position} in the coordinator's admission "
                                        f"queue: {info.placement or 'no free nodes hold its placement yet'}{defaults}")
        placed = {Pool.ROLLOUT: info.rollout_nodes, Pool.TRAIN: info.train_nodes}
        where = ", ".join(dict.fromkeys([*info.train_nodes, *info.rollout_nodes]))
        explain = f"placed in group {info.group_id} on {where}: {info.placement or 'the coordinator placed it'}"
        decision = assign.assign(g.job, _unbound(gs), placed, nodes, used, explain=explain + defaults)
        return decision

    def _admit(self, gs: GangSpec, cluster_jobs: dict[str, JobInfo]) -> JobInfo:
        """The job as the coordinator placed it: registered on its behalf now, or found registered.
        `cluster_jobs` is this cycle's read of the coordinator's jobs, filled on first need."""
        name = gs.spec.name
        if name in self._registered and not cluster_jobs:
            self._read_jobs(cluster_jobs)
        if name in cluster_jobs:
            return cluster_jobs[name]
        try:
            with self.metrics.admit_seconds.time():
                handle = self.coordinator.register_job(gs.spec, attachable=True)
        except AlreadyExistsError:  # registered before (by a restarted scheduler, or before a relocation)
            if name not in self._read_jobs(cluster_jobs):
                raise
            self._registered.add(name)
            return cluster_jobs[name]
        self._registered.add(name)
        assert handle.registration is not None
        return handle.registration

    def _bind(self, g: Gang, decision: GangDecision) -> list[Binding]:
        """Bind each pod of the decision; returns the bindings the API server took."""
        done: list[Binding] = []
        for b in decision.bindings:
            body = {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": b.pod.name, "namespace": b.pod.namespace},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": b.node}}
            try:
                self.kube.create(f"/api/v1/namespaces/{b.pod.namespace}/pods/{b.pod.name}/binding", body)
            except KubeError as exc:  # bound or deleted meanwhile: the next cycle sees the gang as it is
                if exc.status not in (404, 409):
                    raise
                self.metrics.bindings.labels(outcome="conflict").inc()
                log.info("binding %s to %s: %s", b.pod.key, b.node, exc)
                continue
            done.append(b)
            self.cache.assume(b.pod, b.node)
            self.metrics.bindings.labels(outcome="ok").inc()
            self.explainer.tell(b.pod, placed=True, message=decision.message)
        since = self._complete_since.pop((g.namespace, g.job), None)
        if since is not None and len(done) == len(decision.bindings):
            self.metrics.gang_latency.observe(self.clock() - since)
        log.info("job %s: bound %d/%d pods: %s", g.job, len(done), len(decision.bindings), decision.message)
        return done

    # ------------------------------------------------------------------------------ helpers
    def _read_jobs(self, into: dict[str, JobInfo]) -> dict[str, JobInfo]:
        into.clear()
        into.update((j.job, j) for j in self.coordinator.cluster_state().jobs)
        return into

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
        self.explainer.tell(pod, placed=False, message=f"waiting: {why}")

    def _tell_all(self, pods: list[PodView], *, placed: bool, message: str) -> None:
        for pod in pods:
            self.explainer.tell(pod, placed=placed, message=message)


def _unbound(gs: GangSpec) -> list[tuple[PodView, Pool]]:
    return [(p, pool) for p, pool in gs.pools if not p.node_name]
