"""The scheduler explains itself on the pods: a core/v1 Event and the PodScheduled condition.

As kube-scheduler does: success is a ``Normal``/``Scheduled`` event and ``PodScheduled=True``;
waiting is a ``Warning``/``FailedScheduling`` event and ``PodScheduled=False`` whose message says why.
The condition's reason is ``Unschedulable`` only where a node is short of something (what a cluster
autoscaler reads as a reason to add nodes); a pod that waits for its gang, the coordinator's queue or
a scheduling gate gets another reason (`WAITING`, ``SchedulingGated``), so no node is added for it. A pod is told only when its message changes, and the
writes run on a background thread so that they never delay a binding.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import datetime, timezone

from rollmux.k8s.api import CONDITION_TYPE, PodView
from rollmux.k8s.kube import KubeClient, KubeError

log = logging.getLogger("rollmux.k8s")

MAX_MESSAGE = 1024
"""Longest event message the API server keeps."""


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(pod: PodView, *, reason: str, message: str, warning: bool, component: str) -> dict:
    now = _now()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                           "uid": pod.uid},
        "reason": reason, "message": message[:MAX_MESSAGE], "type": "Warning" if warning else "Normal",
        "source": {"component": component}, "reportingComponent": component,
        "action": "Scheduling" if warning else "Binding",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


UNSCHEDULABLE = "Unschedulable"
WAITING = "WaitingForGang"
GATED = "SchedulingGated"


def condition_patch(*, placed: bool, message: str, reason: str = UNSCHEDULABLE) -> dict:
    cond = {"type": CONDITION_TYPE, "status": "True" if placed else "False", "message": message[:MAX_MESSAGE],
            "lastTransitionTime": _now()}
    if not placed:
        cond["reason"] = reason
    return {"status": {"conditions": [cond]}}


class Explainer:
    """Tells pods what happened to them, once per distinct message, off the scheduling thread."""

    def __init__(self, kube: KubeClient, component: str) -> None:
        self.kube, self.component = kube, component
        self._told: dict[str, str] = {}  # pod uid -> the last message it got
        self._queue: queue.Queue[tuple[PodView, bool, str, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="explainer", daemon=True)
        self._thread.start()

    def tell(self, pod: PodView, *, placed: bool, message: str, reason: str = UNSCHEDULABLE) -> bool:
        """Queue an event and a condition (`reason` when not placed) for `pod` unless it already got this
        message; True if queued."""
        if self._told.get(pod.uid) == message:
            return False
        self._told[pod.uid] = message
        self._queue.put((pod, placed, message, reason))
        return True

    def forget(self, live_uids: set[str]) -> None:
        """Drop what is remembered about pods that are gone."""
        for uid in set(self._told) - live_uids:
            del self._told[uid]

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued explanation is written (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(None)
        self._queue.put(done)  # type: ignore[arg-type]
        done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                continue
            if isinstance(item, threading.Event):
                item.set()
                continue
            pod, placed, message, reason = item
            base = f"/api/v1/namespaces/{pod.namespace}"
            try:
                self.kube.create(f"{base}/events", event_body(
                    pod, reason="Scheduled" if placed else "FailedScheduling", message=message,
                    warning=not placed, component=self.component))
                self.kube.patch(f"{base}/pods/{pod.name}/status",
                                condition_patch(placed=placed, message=message, reason=reason), kind="strategic")
            except KubeError as exc:  # the pod may be gone meanwhile: nothing to explain to
                log.info("could not explain to pod %s: %s", pod.key, exc)
