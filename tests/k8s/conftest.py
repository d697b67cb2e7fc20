"""Fixtures: one real Kubernetes control plane per session (kube-apiserver 1.20.2 + etcd, and the
kube-controller-manager's Job controller), a coordinator and a scheduler per test.

Kubernetes 1.20.2 is the newest Kubernetes source a package registry here offers (Debian's
`kubernetes` source package); the chart is installed on it here (test_helm_live.py) and rendered and
schema-validated for 1.30 and 1.34 in tests/charts (charts/rollmux/Chart.yaml says which versions it supports).
Each test serves its own scheduler name, so pods a test leaves behind never reach another's scheduler.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Pool
from rollmux.k8s.kube import KubeClient, KubeError
from rollmux.k8s.scheduler import Scheduler, SchedulerConfig
from rollmux.testing import kube as control_plane
from rollmux.wire.client import CoordinatorClient
from tests.coordinator.service.conftest import add_node, close_node_streams

from .builders import node_obj

SCHEDULER_USER = "system:serviceaccount:rollmux:rm-rollmux-scheduler"  # the chart's ServiceAccount (release rm)
SCHEDULER_TOKEN = "rollmux-test-scheduler"  # a loopback test server's credential, not a secret
LIMITED_USER = "rollmux-limited-scheduler"  # a scheduler identity whose Binding rights a test grants pod by pod
LIMITED_TOKEN = "rollmux-test-limited"  # a loopback test server's credential, not a secret
FAST = ServiceConfig(lease_ttl_s=5.0, reap_interval_s=0.02, heartbeat_interval_s=0.5, relocation_deadline_s=60.0)
_names = itertools.count()
CRDS = Path(__file__).parent / "crds"


@pytest.fixture(scope="session")
def kube_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[control_plane.ControlPlane]:
    why = control_plane.missing()
    if why:
        pytest.skip(f"no Kubernetes control plane: {why}")
    plane = control_plane.ControlPlane(tmp_path_factory.mktemp("kube"), controller_manager=True,
                                       users={SCHEDULER_TOKEN: (SCHEDULER_USER, "system:serviceaccounts"),
                                              LIMITED_TOKEN: (LIMITED_USER, "rollmux-limited")}).start()
    yield plane
    plane.stop()


@pytest.fixture
def kube(kube_plane: control_plane.ControlPlane) -> KubeClient:
    return kube_plane.client()


class Env:
    """One test's world: its namespace, its nodes (in the API server and at the coordinator), its scheduler."""

    def __init__(self, kube: KubeClient, coordinator: ThreadedServer, tag: str,
                 scheduler_kube: KubeClient | None = None) -> None:
        self.kube, self.tag = kube, tag
        self.ns = f"t-{tag}"
        self.client = CoordinatorClient(coordinator.address, retry_s=5.0)
        self.scheduler_kube = scheduler_kube or kube
        self.scheduler = Scheduler(self.scheduler_kube, self.client,
                                   SchedulerConfig(scheduler_name=f"rollmux-{tag}", resync_s=0.2))
        self.thread: threading.Thread | None = None
        self.namespaces = [self.ns]
        kube.create("/api/v1/namespaces", {"metadata": {"name": self.ns}})

    def configure(self, kube: KubeClient | None = None, **config: Any) -> Scheduler:
        """A scheduler (not started) with `config` changed, acting with `kube` (default: as before)."""
        self.scheduler_kube = kube or self.scheduler_kube
        self.scheduler = Scheduler(self.scheduler_kube, self.client, replace(self.scheduler.config, **config))
        return self.scheduler

    def namespace(self, suffix: str) -> str:
        """Another namespace of this test's."""
        ns = f"{self.ns}-{suffix}"
        self.kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        self.namespaces.append(ns)
        return ns

    def qualified(self, job: str) -> str:
        """`job`'s name at the coordinator (its namespace's)."""
        return self.scheduler.conv.qualified(self.ns, job)

    def node(self, name: str, pool: Pool, **kw: Any) -> str:
        """A node named `<tag>-<name>` in the API server and registered at the coordinator."""
        full = f"{self.tag}-{name}"
        self.kube.create("/api/v1/nodes", node_obj(full, pool.value, **kw))
        add_node(self.client, full, pool)
        return full

    def start(self) -> Scheduler:
        self.scheduler.start()
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()
        return self.scheduler

    def pods(self, job: str | None = None) -> list[dict[str, Any]]:
        sel = {"labelSelector": f"rollmux.io/job={job}"} if job else {}
        return self.kube.list(f"/api/v1/namespaces/{self.ns}/pods", **sel)[0]

    def create_pod(self, obj: dict[str, Any], ns: str = "") -> dict[str, Any]:
        obj["spec"]["schedulerName"] = self.scheduler.config.scheduler_name
        return self.kube.create(f"/api/v1/namespaces/{ns or self.ns}/pods", obj)

    def events(self, pod: str, ns: str = "") -> list[dict[str, Any]]:
        return self.kube.list(f"/api/v1/namespaces/{ns or self.ns}/events",
                              fieldSelector=f"involvedObject.name={pod}")[0]

    def close(self) -> None:
        self.scheduler.stop()
        if self.thread is not None:
            self.thread.join(5)
        close_node_streams()
        self.client.close()


@pytest.fixture
def env(kube: KubeClient, request: pytest.FixtureRequest) -> Iterator[Env]:
    """The scheduler acts with the admin token, or (marker ``as_chart_scheduler``) as the chart's ServiceAccount."""
    tag = re.sub(r"[^a-z0-9]", "", request.node.name.lower())[-20:] + str(next(_names))
    srv = ThreadedServer(ServerOptions(config=FAST, http="127.0.0.1:0"))
    assert srv.wait_ready(10), srv.core.not_ready_reason
    as_chart = request.node.get_closest_marker("as_chart_scheduler") is not None
    e = Env(kube, srv, tag, request.getfixturevalue("kube_plane").client(SCHEDULER_TOKEN) if as_chart else None)
    yield e
    e.close()
    srv.stop()


def wait_for(what: str, cond: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except KubeError as exc:  # a read racing a write: try again
            last = exc
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "as_chart_scheduler: the scheduler acts as the chart's ServiceAccount")


def install_crds(kube: KubeClient, file: str) -> list[str]:
    """Create the CustomResourceDefinitions in crds/`file` (kept if an earlier test made them) and wait until
    the server serves them; returns their names."""
    names = []
    for crd in yaml.safe_load_all((CRDS / file).read_text()):
        try:
            kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except KubeError as exc:
            if exc.status != 409:
                raise
        names.append(crd["metadata"]["name"])
    for n in names:
        wait_for(f"CRD {n} established", lambda n=n: any(
            c["type"] == "Established" and c["status"] == "True" for c in
            (kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}").get("status") or {})
            .get("conditions") or []))
    return names
