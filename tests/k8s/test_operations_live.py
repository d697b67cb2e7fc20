"""Operating the scheduler on a real kube-apiserver 1.20.2: two replicas elect a leader on a Lease and
never double-book a node, a killed informer turns /readyz red, and a PodGroup (scheduler-plugins'
``scheduling.x-k8s.io/v1alpha1``, as KubeRay's batch-scheduler makes it) sizes and names a gang."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest

from rollmux.core.model import Pool
from rollmux.k8s.health import HealthServer
from rollmux.k8s.kube import KubeClient, KubeError
from rollmux.k8s.leader import LeaseConfig
from rollmux.k8s.scheduler import Scheduler

from .builders import pod_obj
from .conftest import Env, install_crds, wait_for
from .test_scheduler_live import bound

ANN = {"rollmux.io/gang-size": "2", "rollmux.io/slo": "1.2", "rollmux.io/t-roll-s": "10", "rollmux.io/t-train-s": "10"}


def test_two_replicas_elect_one_leader_and_never_double_book_a_node(env: Env) -> None:
    nodes = [env.node(f"{p[0]}{i}", p, replicas=2) for p in (Pool.ROLLOUT, Pool.TRAIN) for i in range(3)]
    replicas: list[Scheduler] = []
    threads = []
    for ident in ("s1", "s2"):
        lease = LeaseConfig(namespace=env.ns, identity=ident, lease_s=3.0, renew_deadline_s=2.0, retry_s=0.2)
        s = env.configure(lease=lease).start()
        t = threading.Thread(target=s.run, daemon=True)
        t.start()
        replicas.append(s)
        threads.append(t)
    try:
        wait_for("one leader", lambda: sum(s.leading for s in replicas) == 1)
        jobs = [f"j{i}" for i in range(8)]
        for job in jobs[:4]:
            for pool in ("rollout", "train"):
                env.create_pod(pod_obj(f"{job}-{pool}", job, pool=pool, annotations=ANN, ns=env.ns))
        wait_for("the first gangs bound", lambda: all(bound(env, j) for j in jobs[:4]), timeout_s=30)
        leader = next(s for s in replicas if s.leading)
        leader.stop()  # it gives the Lease up; the standby takes over
        standby = next(s for s in replicas if s is not leader)
        wait_for("the standby leading", lambda: standby.leading, timeout_s=15)
        for job in jobs[4:]:
            for pool in ("rollout", "train"):
                env.create_pod(pod_obj(f"{job}-{pool}", job, pool=pool, annotations=ANN, ns=env.ns))
        wait_for("every gang the fleet holds bound", lambda: sum(bool(bound(env, j)) for j in jobs) == 6,
                 timeout_s=30)
        assert sum(s.leading for s in replicas) == 1
        lease = env.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{env.ns}/leases/rollmux-scheduler")
        assert lease["spec"]["holderIdentity"] == standby.config.lease.identity  # type: ignore[union-attr]
        per_node: dict[str, list[str]] = {n: [] for n in nodes}
        for p in env.pods():
            if p["spec"].get("nodeName"):
                per_node[p["spec"]["nodeName"]].append(p["metadata"]["labels"]["rollmux.io/job"])
        for node, jobs_there in per_node.items():  # 8 GPUs x 2 replicas: at most two 8-GPU pods, two jobs
            assert len(jobs_there) <= 2 and len(set(jobs_there)) <= 2, (node, jobs_there)
    finally:
        for s in replicas:
            s.stop()
        for t in threads:
            t.join(5)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the informer dies on purpose
def test_a_killed_informer_turns_readiness_and_liveness_red(env: Env) -> None:
    env.node("r0", Pool.ROLLOUT)
    s = env.start()
    server = HealthServer("127.0.0.1", 0, s.metrics.registry, s.health)

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert wait_for("ready", lambda: status("/readyz") == 200)
        assert status("/livez") == 200

        def broken(kind: str, obj: dict) -> None:
            raise RuntimeError("an informer bug")

        pods_informer = next(i for i in s._informers if i.path == "/api/v1/pods")
        pods_informer.apply = broken  # type: ignore[method-assign]
        env.create_pod(pod_obj("poke", "poke", pool="train", annotations=ANN, ns=env.ns))  # the watch delivers it
        wait_for("readiness red", lambda: status("/readyz") == 503)
        assert status("/livez") == 503
        assert "informer /api/v1/pods stopped" in s.health()
    finally:
        server.close()


def test_a_podgroup_names_and_sizes_the_gang_without_rollmux_labels(env: Env, kube: KubeClient) -> None:
    install_crds(kube, "podgroups.yaml")
    rollout, train = env.node("r0", Pool.ROLLOUT), env.node("t0", Pool.TRAIN)
    env.start()
    kube.create(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{env.ns}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "raycluster-a"}, "spec": {"minMember": 3}})
    labels = {"scheduling.x-k8s.io/pod-group": "raycluster-a"}
    ann = {"rollmux.io/slo": "1.2", "rollmux.io/rollout-gpus": "8", "rollmux.io/train-gpus": "8"}
    pods = [pod_obj("raycluster-a-head", None, gpus=0, labels=labels, annotations=ann, ns=env.ns),
            pod_obj("raycluster-a-worker-0", None, labels=labels, annotations=ann, ns=env.ns),
            pod_obj("raycluster-a-worker-1", None, labels=labels, annotations=ann, ns=env.ns)]
    for p in pods[:2]:
        env.create_pod(p)
    wait_for("2/3 explained", lambda: any("2/3 pods of job 'raycluster-a'" in e["message"]
                                          for e in env.events("raycluster-a-head")))
    env.create_pod(pods[2])

    def all_bound() -> dict[str, str]:
        got = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in env.pods()}
        return got if len(got) == 3 and all(got.values()) else {}

    got = wait_for("the PodGroup's gang bound", all_bound)
    assert set(got.values()) == {rollout, train}
    assert any(j.job == env.qualified("raycluster-a") for j in env.client.cluster_state().jobs)


class BreakingWatches(KubeClient):
    """The real API server, but every watch stream breaks after a few events (as a flaky network or an
    API-server restart breaks it): the informers list again, again and again, while gangs bind."""

    def watch(self, path, resource_version, **kw):  # type: ignore[no-untyped-def, override]
        for i, item in enumerate(super().watch(path, resource_version, **kw)):
            if i == 1:
                raise KubeError(0, "stream broken by the test")
            yield item


def test_relists_under_load_never_bind_onto_a_full_node(env: Env, kube: KubeClient) -> None:
    nodes = [env.node(f"{p[0]}{i}", p, replicas=2) for p in (Pool.ROLLOUT, Pool.TRAIN) for i in range(2)]
    flaky = BreakingWatches(kube.config)
    s = env.configure(flaky).start()
    for inf in s._informers:
        inf.page_size = 5  # paged lists: a cycle must never see half of one
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    jobs = [f"j{i}" for i in range(6)]
    for job in jobs:
        for pool in ("rollout", "train"):
            env.create_pod(pod_obj(f"{job}-{pool}", job, pool=pool, annotations=ANN, ns=env.ns))
    wait_for("every gang the fleet holds bound", lambda: sum(bool(bound(env, j)) for j in jobs) == 4, timeout_s=60)
    assert sum(inf.relists for inf in s._informers) > 2  # relisted while the gangs bound, beyond the first lists
    per_node: dict[str, list[str]] = {n: [] for n in nodes}
    for p in env.pods():
        if p["spec"].get("nodeName"):
            per_node[p["spec"]["nodeName"]].append(p["metadata"]["labels"]["rollmux.io/job"])
    for node, jobs_there in per_node.items():
        assert len(jobs_there) <= 2, (node, jobs_there)
