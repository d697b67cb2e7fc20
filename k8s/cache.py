"""The scheduler's view of the cluster: every non-terminal pod and every node, kept by list + watch.

One informer thread per resource lists, then watches from the list's resourceVersion; a 410 Gone (or
any broken stream) lists again. Pods the scheduler bound are *assumed* on their node at once
(`assume`), so the next cycle counts their capacity before the watch reports the binding.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rollmux.k8s.api import NodeUsage, NodeView, PodView, SchedulerError
from rollmux.k8s.kube import KubeClient, KubeError
from rollmux.k8s.objects import node_view, pod_view

log = logging.getLogger("rollmux.k8s")


class ClusterCache:
    """Pods (by uid) and nodes (by name), safe to read from the scheduling thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pods: dict[str, PodView] = {}
        self.nodes: dict[str, NodeView] = {}
        self.bad_pods: dict[str, tuple[dict[str, Any], str]] = {}  # uid -> (object, why it does not parse)
        self.changed = threading.Event()  # set on every change: wakes the scheduling loop

    def replace_pods(self, objs: list[dict[str, Any]]) -> None:
        with self._lock:
            self.pods.clear()
            self.bad_pods.clear()
        for obj in objs:
            self.apply_pod("ADDED", obj)

    def replace_nodes(self, objs: list[dict[str, Any]]) -> None:
        with self._lock:
            self.nodes = {v.name: v for v in map(node_view, objs)}
        self.changed.set()

    def apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                self.bad_pods.pop(uid, None)
            else:
                try:
                    view = pod_view(obj)
                except SchedulerError as exc:
                    self.bad_pods[uid] = (obj, str(exc))
                    self.pods.pop(uid, None)
                else:
                    self.bad_pods.pop(uid, None)
                    old = self.pods.get(uid)
                    if old is not None and old.node_name and not view.node_name:
                        view = replace(view, node_name=old.node_name)  # assumed bound; the watch lags
                    if view.terminal:
                        self.pods.pop(uid, None)
                    else:
                        self.pods[uid] = view
        self.changed.set()

    def apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        view = node_view(obj)
        with self._lock:
            if kind == "DELETED":
                self.nodes.pop(view.name, None)
            else:
                self.nodes[view.name] = view
        self.changed.set()

    def assume(self, pod: PodView, node: str) -> None:
        """Count `pod` on `node` now (it was bound; the watch will confirm)."""
        with self._lock:
            if pod.uid in self.pods:
                self.pods[pod.uid] = replace(self.pods[pod.uid], node_name=node)

    def snapshot(self) -> tuple[list[PodView], dict[str, NodeView], list[tuple[dict[str, Any], str]]]:
        with self._lock:
            return list(self.pods.values()), dict(self.nodes), list(self.bad_pods.values())


def usage(pods: list[PodView], nodes: dict[str, NodeView]) -> dict[str, NodeUsage]:
    """What bound, non-terminal pods (any scheduler) take of each node."""
    gpus: dict[str, int] = {}
    count: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    for pod in pods:
        if pod.node_name and not pod.terminal:
            gpus[pod.node_name] = gpus.get(pod.node_name, 0) + pod.gpus
            count[pod.node_name] = count.get(pod.node_name, 0) + 1
            if pod.job:
                jobs.setdefault(pod.node_name, set()).add(pod.job)
    return {n: NodeUsage(gpus=gpus.get(n, 0), pods=count.get(n, 0), jobs=frozenset(jobs.get(n, ())))
            for n in nodes}


def add_pod(used: NodeUsage, pod: PodView) -> NodeUsage:
    """`used` with `pod` bound there too."""
    return replace(used, gpus=used.gpus + pod.gpus, pods=used.pods + 1,
                   jobs=used.jobs | {pod.job} if pod.job else used.jobs)


class Informer(threading.Thread):
    """List + watch one resource into the cache until `stop` is set."""

    def __init__(self, kube: KubeClient, path: str, replace_all: Callable[[list[dict[str, Any]]], None],
                 apply: Callable[[str, dict[str, Any]], None], stop: threading.Event, *,
                 watch_timeout_s: int = 60) -> None:
        super().__init__(name=f"informer {path}", daemon=True)
        self.kube, self.path, self.replace_all, self.apply, self.stop = kube, path, replace_all, apply, stop
        self.watch_timeout_s = watch_timeout_s
        self.synced = threading.Event()  # the first list is in the cache

    def run(self) -> None:
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    items, rv = self.kube.list(self.path)
                    self.replace_all(items)
                    self.synced.set()
                for kind, obj in self.kube.watch(self.path, rv, timeout_s=self.watch_timeout_s):
                    if self.stop.is_set():
                        return
                    self.apply(kind, obj)
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
            except KubeError as exc:
                if exc.status != 410:
                    log.warning("watch of %s broke (%s): listing again", self.path, exc)
                    self.stop.wait(0.5)
                rv = ""
