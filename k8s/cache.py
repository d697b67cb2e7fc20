"""The scheduler's view of the cluster: every non-terminal pod and every node, kept by list + watch.

One informer thread per resource lists, then watches from the list's resourceVersion; a 410 Gone (or
any broken stream) lists again. Pods the scheduler bound are *assumed* on their node at once
(`assume`), so the next cycle counts their capacity before the watch reports the binding.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rollmux.k8s.api import Conventions, NodeView, PodView, SchedulerError
from rollmux.k8s.kube import GoneError, KubeClient, KubeError
from rollmux.k8s.objects import node_view, pod_view
from rollmux.k8s.usage import add_pod, usage  # noqa: F401 (the scheduler's view of them)

log = logging.getLogger("rollmux.k8s")


class ClusterCache:
    """Pods (by uid) and nodes (by name), safe to read from the scheduling thread."""

    def __init__(self, conv: Conventions = Conventions()) -> None:  # noqa: B008 (frozen)
        self.conv = conv
        self._lock = threading.Lock()
        self.pods: dict[str, PodView] = {}
        self.nodes: dict[str, NodeView] = {}
        self.bad_pods: dict[str, tuple[dict[str, Any], str]] = {}  # uid -> (object, why it does not parse)
        self.changed = threading.Event()  # set on every change: wakes the scheduling loop

    def _parse(self, obj: dict[str, Any]) -> tuple[PodView | None, str]:
        try:
            return pod_view(obj, self.conv), ""
        except SchedulerError as exc:
            return None, str(exc)

    def replace_pods(self, objs: list[dict[str, Any]]) -> None:
        """A relist, swapped in at once: a cycle sees the old list or the new one, never half of it."""
        pods: dict[str, PodView] = {}
        bad: dict[str, tuple[dict[str, Any], str]] = {}
        for obj in objs:
            uid = (obj.get("metadata") or {}).get("uid", "")
            view, why = self._parse(obj)
            if view is None:
                bad[uid] = (obj, why)
            elif not view.terminal:
                pods[uid] = view
        with self._lock:
            for uid, view in pods.items():  # a pod assumed bound stays bound until the list shows it
                old = self.pods.get(uid)
                if old is not None and old.node_name and not view.node_name:
                    pods[uid] = replace(view, node_name=old.node_name)
            self.pods, self.bad_pods = pods, bad
        self.changed.set()

    def replace_nodes(self, objs: list[dict[str, Any]]) -> None:
        nodes = {v.name: v for v in (node_view(o, self.conv) for o in objs)}
        with self._lock:
            self.nodes = nodes
        self.changed.set()

    def apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        view, why = (None, "") if kind == "DELETED" else self._parse(obj)
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                self.bad_pods.pop(uid, None)
            elif view is None:
                self.bad_pods[uid] = (obj, why)
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
        view = node_view(obj, self.conv)
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


class Informer(threading.Thread):
    """List + watch one resource into the cache until `stop` is set.

    A relist pages through the collection (`page_size`) and is swapped in whole; a watch resumes from the
    last event's or bookmark's resourceVersion; a broken watch or list backs off (doubling to
    `max_backoff_s` while the server gives nothing). `alive_at` is when the thread last made progress (the watchdog reads it)."""

    def __init__(self, kube: KubeClient, path: str, replace_all: Callable[[list[dict[str, Any]]], None],
                 apply: Callable[[str, dict[str, Any]], None], stop: threading.Event, *,
                 watch_timeout_s: int = 60, page_size: int = 500, max_backoff_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name=f"informer {path}", daemon=True)
        self.kube, self.path, self.replace_all, self.apply, self.stop = kube, path, replace_all, apply, stop
        self.watch_timeout_s, self.page_size, self.max_backoff_s = watch_timeout_s, page_size, max_backoff_s
        self.clock = clock
        self.synced = threading.Event()  # the first list is in the cache
        self.alive_at = clock()
        self.relists = 0

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": self.page_size}
        while True:
            got = self.kube.request("GET", self.path, params=params)
            items.extend(got.get("items") or [])
            meta = got.get("metadata") or {}
            if not meta.get("continue"):
                return items, meta.get("resourceVersion", "")
            params = {"limit": self.page_size, "continue": meta["continue"]}

    def run(self) -> None:
        rv, backoff = "", 0.5
        while not self.stop.is_set():
            try:
                if not rv:
                    items, rv = self._list()
                    self.relists += 1
                    self.replace_all(items)
                    self.synced.set()
                    self.alive_at = self.clock()
                for kind, obj in self.kube.watch(self.path, rv, timeout_s=self.watch_timeout_s, bookmarks=True):
                    if self.stop.is_set():
                        return
                    if kind != "BOOKMARK":
                        self.apply(kind, obj)
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    self.alive_at = self.clock()
                    backoff = 0.5  # the server answers: a later break starts backing off afresh
                self.alive_at = self.clock()  # the server ended the watch on time: renew from rv
                backoff = 0.5
            except GoneError:
                rv = ""  # too old: list again at once
            except KubeError as exc:
                log.warning("watch of %s broke (%s): listing again in %.1f s", self.path, exc, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                rv = ""
