"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Several scheduler replicas run; the one holding the Lease schedules, the others keep their caches warm
and wait. The holder renews every `retry_s`; a holder that cannot renew within `renew_deadline_s`
stops scheduling at once (before `lease_s` passes, after which another replica may take the Lease), so
two replicas never bind at the same time. Every write carries the Lease's resourceVersion, so two
candidates racing for an expired Lease cannot both win (the API server answers the loser 409).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rollmux.k8s.kube import KubeClient, KubeError

log = logging.getLogger("rollmux.k8s")


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseConfig:
    namespace: str
    name: str = "rollmux-scheduler"
    identity: str  # this replica (its pod name)
    lease_s: float = 15.0  # another replica may take the Lease this long after its last renewal
    renew_deadline_s: float = 10.0  # the holder stops leading if it could not renew for this long
    retry_s: float = 2.0  # how often a candidate tries, and the holder renews


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


class LeaderElector(threading.Thread):
    """Holds the Lease while it can; `leading` is set while this replica may schedule."""

    def __init__(self, kube: KubeClient, config: LeaseConfig, stop: threading.Event, *,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="leader election", daemon=True)
        self.kube, self.config, self.stop = kube, config, stop
        self.wall, self.clock = wall, clock
        self.leading = threading.Event()
        self._renewed_at = 0.0  # monotonic time of the last successful renewal
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{config.namespace}/leases"

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    self._renewed_at = self.clock()
                    if not self.leading.is_set():
                        log.info("leading as %s (lease %s/%s)", self.config.identity, self.config.namespace,
                                 self.config.name)
                        self.leading.set()
                else:
                    self._lose("another replica holds the lease")
            except KubeError as exc:
                log.warning("lease %s/%s: %s", self.config.namespace, self.config.name, exc)
            if self.leading.is_set() and self.clock() - self._renewed_at > self.config.renew_deadline_s:
                self._lose(f"could not renew within {self.config.renew_deadline_s:g} s")
            self.stop.wait(self.config.retry_s)
        self.release()

    def _lose(self, why: str) -> None:
        if self.leading.is_set():
            log.warning("no longer leading: %s", why)
            self.leading.clear()

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True if this replica holds the Lease now.

        Raises:
            KubeError: the API server could not be asked (409, a lost race, is answered False).
        """
        c, now = self.config, self.wall()
        spec = {"holderIdentity": c.identity, "leaseDurationSeconds": int(c.lease_s), "renewTime": _micro(now)}
        try:
            lease: dict[str, Any] = self.kube.get(f"{self.path}/{c.name}")
        except KubeError as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": c.name, "namespace": c.namespace},
                    "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0}}
            return self._write("POST", self.path, body)
        held = lease.get("spec") or {}
        holder = held.get("holderIdentity") or ""
        expires = _parse(held.get("renewTime")) + float(held.get("leaseDurationSeconds") or c.lease_s)
        if holder and holder != c.identity and now < expires:
            return False
        new = dict(held, **spec)
        if holder != c.identity:
            new.update(acquireTime=_micro(now), leaseTransitions=int(held.get("leaseTransitions") or 0) + 1)
        return self._write("PUT", f"{self.path}/{c.name}", {**lease, "spec": new})

    def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.kube.request(method, path, body)
        except KubeError as exc:
            if exc.status == 409:  # another candidate wrote first
                return False
            raise
        return True

    def release(self) -> None:
        """Give the Lease up on a clean stop, so a standby takes over without waiting it out."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = self.kube.get(f"{self.path}/{self.config.name}")
            if (lease.get("spec") or {}).get("holderIdentity") == self.config.identity:
                spec = dict(lease["spec"], holderIdentity="", leaseDurationSeconds=1)
                self.kube.request("PUT", f"{self.path}/{self.config.name}", {**lease, "spec": spec})
        except KubeError as exc:
            log.info("releasing the lease: %s", exc)
