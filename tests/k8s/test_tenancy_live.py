"""Tenancy and fit on a real kube-apiserver 1.20.2 with a real gRPC coordinator: a job's name at the
coordinator is its namespace's, a reused registration must fit the gang, and a pod is bound only where
kubelet would admit it (every requested resource, counting pods of any scheduler)."""

from __future__ import annotations

from rollmux.core.model import JobSpec, Pool

from .builders import pod_obj
from .conftest import Env, wait_for
from .test_scheduler_live import bound

ANN = {"rollmux.io/gang-size": "2", "rollmux.io/slo": "1.0", "rollmux.io/t-roll-s": "10", "rollmux.io/t-train-s": "10"}


def gang(env: Env, job: str, ns: str = "", **kw: object) -> None:
    for pool in ("rollout", "train"):
        env.create_pod(pod_obj(f"{job}-{pool}", job, pool=pool, annotations=ANN, ns=ns or env.ns, **kw),  # type: ignore[arg-type]
                       ns=ns)


def bound_in(env: Env, ns: str, job: str) -> dict[str, str]:
    pods = env.kube.list(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"rollmux.io/job={job}")[0]
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
    return nodes if pods and all(nodes.values()) else {}


def said(env: Env, pod: str, text: str, ns: str = "") -> bool:
    return any(text in e["message"] for e in env.events(pod, ns))


def test_two_namespaces_same_named_jobs_never_share_a_registration_or_nodes(env: Env) -> None:
    for name, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN)):
        env.node(name, pool)  # SLO 1.0: no sharing, so each job needs nodes of its own
    other = env.namespace("b")
    env.start()
    gang(env, "train7b")
    first = wait_for("the first train7b bound", lambda: bound_in(env, env.ns, "train7b"))
    gang(env, "train7b", ns=other)
    second = wait_for("the other namespace's train7b bound", lambda: bound_in(env, other, "train7b"))
    assert not set(first.values()) & set(second.values())  # no tenant on another's nodes
    jobs = {j.job: j for j in env.client.cluster_state().jobs}
    assert {f"{env.ns}.train7b", f"{other}.train7b"} <= set(jobs)
    assert jobs[f"{env.ns}.train7b"].group_id != jobs[f"{other}.train7b"].group_id


def test_a_reused_registration_of_another_shape_is_an_event_not_a_bind(env: Env) -> None:
    env.node("r0", Pool.ROLLOUT)
    env.node("t0", Pool.TRAIN)
    env.node("t1", Pool.TRAIN)
    env.client.register_job(JobSpec(name=env.qualified("m"), n_rollout_gpus=8, n_train_gpus=8, slo=1.0,
                                    t_roll_s=10.0, t_train_s=10.0), attachable=True)  # made for one train node
    env.start()
    ann = {**ANN, "rollmux.io/gang-size": "3"}
    env.create_pod(pod_obj("m-rollout", "m", pool="rollout", annotations=ann, ns=env.ns))
    for i in range(2):  # the gang asks for two training nodes' GPUs
        env.create_pod(pod_obj(f"m-train-{i}", "m", pool="train", annotations=ann, ns=env.ns))
    wait_for("the mismatch explained", lambda: said(env, "m-train-0", "is already registered at the coordinator"))
    env.scheduler.explainer.flush()
    assert not any(p["spec"].get("nodeName") for p in env.pods("m"))


def test_a_pod_asking_more_cpu_than_any_node_waits_and_a_full_node_is_not_bound_onto(env: Env) -> None:
    env.node("r0", Pool.ROLLOUT)  # 64 CPUs, 512Gi each
    t0 = env.node("t0", Pool.TRAIN)
    env.start()
    gang(env, "huge", requests={"cpu": "100"})
    wait_for("the cpu explained", lambda: said(env, "huge-rollout", "requests 100 cpu but the largest rollout node "
                                                                   "allocates 64: it can never fit"))
    # a default-scheduler pod already holds most of t0's memory (bound as kube-scheduler binds it)
    other = pod_obj("web", None, gpus=0, ns=env.ns, scheduler="default-scheduler", requests={"memory": "500Gi"})
    env.kube.create(f"/api/v1/namespaces/{env.ns}/pods", other)
    env.kube.create(f"/api/v1/namespaces/{env.ns}/pods/web/binding",
                    {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web"},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": t0}})
    gang(env, "fat", requests={"memory": "64Gi"})
    wait_for("the memory shortfall explained",
             lambda: said(env, "fat-train", f"fits none of its train nodes ({t0}): 0/1 nodes are available: "
                                            "1 Insufficient memory"))
    env.scheduler.explainer.flush()
    assert not any(p["spec"].get("nodeName") for p in env.pods("fat")) and not env.pods("huge")[0]["spec"].get(
        "nodeName")
    assert bound(env, "fat") == {}
