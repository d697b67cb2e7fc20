"""No half gangs, no starvation, and the coordinator told, on a real kube-apiserver 1.20.2 (and its Job
and garbage-collector controllers) with a real gRPC coordinator.

A Binding is denied pod by pod with RBAC: the scheduler acts as a user granted everything the chart's
ClusterRole grants except ``pods/binding``, which a Role in the test's namespace grants for named pods
only (``resourceNames``), so the API server answers 403 for the others.
"""

from __future__ import annotations

from typing import Any

from rollmux.core.model import Pool
from rollmux.k8s.kube import KubeClient
from tests.charts.conftest import ci_values, name, render

from .builders import job_obj, pod_obj
from .conftest import LIMITED_TOKEN, LIMITED_USER, Env, wait_for
from .test_relocation_live import ANN as JOB_ANN
from .test_scheduler_live import bound
from .test_tenancy_live import gang, said

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def binder(env: Env, kube: KubeClient, allowed: list[str]) -> dict[str, Any]:
    """Grant the limited user the chart's rights but Bindings of `allowed` pods only; returns the Role."""
    rules = [r for r in render(ci_values("defaults")).one("ClusterRole", name("scheduler"))["rules"]
             if "pods/binding" not in r["resources"]]
    subject = [{"kind": "User", "name": LIMITED_USER, "apiGroup": "rbac.authorization.k8s.io"}]
    kube.create(f"{RBAC}/clusterroles", {"metadata": {"name": f"{env.tag}-limited"}, "rules": rules})
    kube.create(f"{RBAC}/clusterrolebindings", {
        "metadata": {"name": f"{env.tag}-limited"}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{env.tag}-limited"}})
    role = kube.create(f"{RBAC}/namespaces/{env.ns}/roles", {
        "metadata": {"name": "binder"},
        "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"], "resourceNames": allowed}]})
    kube.create(f"{RBAC}/namespaces/{env.ns}/rolebindings", {
        "metadata": {"name": "binder"}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"}})
    limited = limited_client(kube)
    wait_for("the limited user's rights", lambda: limited.list("/api/v1/nodes", limit=1) is not None)
    return role


def limited_client(kube: KubeClient) -> KubeClient:
    return KubeClient(type(kube.config)(server=kube.config.server, token=LIMITED_TOKEN, insecure=True))


def test_a_denied_binding_does_not_block_other_gangs_and_the_gang_is_retried_until_whole(
        env: Env, kube: KubeClient) -> None:
    for n, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN)):
        env.node(n, pool)
    role = binder(env, kube, ["a-rollout", "b-rollout", "b-train"])  # a-train's Binding is denied
    env.configure(limited_client(kube), gang_timeout_s=120)
    env.start()
    gang(env, "a")  # older: looked at first
    gang(env, "b")
    wait_for("b bound whole though a's Binding failed first", lambda: bound(env, "b"))
    wait_for("a's failed Binding explained", lambda: said(env, "a-train", "binding pod a-train to"))
    assert any("403" in e["message"] for e in env.events("a-train"))
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in env.pods("a")}
    assert pods["a-rollout"] and not pods["a-train"]  # half bound, and retried
    role["rules"][0]["resourceNames"].append("a-train")  # the denial is lifted
    kube.request("PUT", f"{RBAC}/namespaces/{env.ns}/roles/binder", role)
    got = wait_for("a bound whole", lambda: bound(env, "a"))
    info = next(j for j in env.client.cluster_state().jobs if j.job == env.qualified("a"))
    assert set(got.values()) == {*info.rollout_nodes, *info.train_nodes}


def test_a_gang_not_whole_by_its_timeout_is_evicted_and_its_placement_released(env: Env, kube: KubeClient) -> None:
    env.node("r0", Pool.ROLLOUT)
    env.node("t0", Pool.TRAIN)
    binder(env, kube, ["c-rollout"])
    env.configure(limited_client(kube), gang_timeout_s=2.0)
    env.start()
    gang(env, "c")
    wait_for("c-rollout bound", lambda: env.kube.get(f"/api/v1/namespaces/{env.ns}/pods/c-rollout")["spec"].get(
        "nodeName"))
    assert any(j.job == env.qualified("c") for j in env.client.cluster_state().jobs)
    wait_for("the gang timeout explained", lambda: said(env, "c-train", "gang timeout"), timeout_s=30)
    evicted = env.kube.get(f"/api/v1/namespaces/{env.ns}/pods/c-rollout")  # no kubelet: it stays Terminating
    assert evicted["metadata"].get("deletionTimestamp")
    assert not any(j.job == env.qualified("c") for j in env.client.cluster_state().jobs)


def test_a_deleted_jobs_registration_is_released(env: Env) -> None:
    env.node("r0", Pool.ROLLOUT)
    env.node("t0", Pool.TRAIN)
    env.configure(release_grace_s=0.5)
    env.start()
    jobs = f"/apis/batch/v1/namespaces/{env.ns}/jobs"
    env.kube.create(jobs, job_obj("a", ns=env.ns, scheduler=env.scheduler.config.scheduler_name, annotations=JOB_ANN))
    wait_for("a bound", lambda: bound(env, "a"))
    assert any(j.job == env.qualified("a") for j in env.client.cluster_state().jobs)
    env.kube.delete(f"{jobs}/a", propagationPolicy="Background")  # no driver ever attached
    wait_for("a deregistered", lambda: not any(j.job == env.qualified("a") for j in env.client.cluster_state().jobs),
             timeout_s=30)


def test_a_cordoned_placed_node_is_drained_at_the_coordinator_and_the_job_placed_again(env: Env) -> None:
    r0 = env.node("r0", Pool.ROLLOUT)
    t0 = env.node("t0", Pool.TRAIN)
    env.kube.patch(f"/api/v1/nodes/{t0}", {"spec": {"unschedulable": True}})  # the coordinator does not know
    env.start()
    gang(env, "a")
    wait_for("t0 drained at the coordinator", lambda: next(
        n.state for n in env.client.cluster_state().nodes if n.node_id == t0) in ("draining", "drained"))
    wait_for("the re-placement explained", lambda: said(env, "a-train", "which places the job again"))
    assert bound(env, "a") == {}
    t1 = env.node("t1", Pool.TRAIN)  # capacity arrives: the job is placed there
    got = wait_for("a bound", lambda: bound(env, "a"))
    assert set(got.values()) == {r0, t1}


def test_pods_of_any_scheduler_and_bound_siblings_count(env: Env) -> None:
    """A replacement pod beside a bound sibling never stacks past the job's physical GPUs on one node."""
    for n, pool in (("r0", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN)):
        env.node(n, pool, replicas=4)
    env.start()
    ann = {**JOB_ANN, "rollmux.io/gang-size": "3", "rollmux.io/train-gpus": "16"}
    env.create_pod(pod_obj("s-rollout", "s", pool="rollout", annotations=ann, ns=env.ns))
    for i in range(2):
        env.create_pod(pod_obj(f"s-train-{i}", "s", pool="train", annotations=ann, ns=env.ns))
    first = wait_for("s bound", lambda: bound(env, "s"))
    train_nodes = {first["s-train-0"], first["s-train-1"]}
    assert len(train_nodes) == 2
    env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/s-train-1", gracePeriodSeconds=0)  # the later one
    env.create_pod(pod_obj("s-train-9", "s", pool="train", annotations=ann, ns=env.ns))  # its replacement
    got = wait_for("the replacement bound", lambda: (b := bound(env, "s")) and "s-train-9" in b and b)
    assert got["s-train-9"] == first["s-train-1"] != got["s-train-0"]  # not on the sibling's node
