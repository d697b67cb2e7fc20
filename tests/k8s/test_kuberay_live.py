"""KubeRay on the real kube-apiserver 1.20.2 (conftest.py says why that version): the RayJob example's
pods, created as KubeRay's operator creates them (owned by a RayCluster the RayJob owns), are one gang
sized from the RayCluster's head and worker replicas, and bound where the coordinator placed the job.

No operator runs here: the test makes the RayCluster and the pods from the RayJob's templates, as
KubeRay does (the CRDs have minimal schemas, crds/kuberay.yaml).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from rollmux.core.model import Pool
from rollmux.k8s.api import JOB_LABEL, POOL_LABEL
from rollmux.k8s.kube import KubeClient
from tests.charts.conftest import CHART

from .conftest import Env, install_crds, wait_for
from .test_scheduler_live import bound

RAYJOB = CHART / "examples" / "verl-grpo-rayjob.yaml"


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def operator_pods(cluster: dict[str, Any], scheduler: str) -> list[dict[str, Any]]:
    """The pods KubeRay makes for `cluster`: a head and each worker group's replicas, owned by the cluster."""
    spec = cluster["spec"]
    templates = [("head", spec["headGroupSpec"]["template"])]
    for group in spec["workerGroupSpecs"]:
        templates += [(f"{group['groupName']}-worker-{i}", group["template"]) for i in range(group["replicas"])]
    pods = []
    for suffix, template in templates:
        t = copy.deepcopy(template)
        t["spec"]["schedulerName"] = scheduler
        pods.append({"apiVersion": "v1", "kind": "Pod", "spec": t["spec"],
                     "metadata": {**t["metadata"], "name": f"{cluster['metadata']['name']}-{suffix}",
                                  "ownerReferences": [owner_ref(cluster)]}})
    return pods


def test_the_rayjob_examples_pods_are_one_gang_sized_by_their_raycluster(env: Env, kube: KubeClient) -> None:
    install_crds(kube, "kuberay.yaml")
    rollout, train = env.node("r0", Pool.ROLLOUT), env.node("t0", Pool.TRAIN)
    env.node("t1", Pool.TRAIN)  # a node the job does not need: the placement, not the first fit, decides
    env.start()
    (rayjob,) = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d]
    job = rayjob = kube.create(f"/apis/ray.io/v1/namespaces/{env.ns}/rayjobs", rayjob)  # stored as the user wrote it
    name = rayjob["metadata"]["name"]
    cluster = kube.create(f"/apis/ray.io/v1/namespaces/{env.ns}/rayclusters", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": f"{name}-raycluster", "ownerReferences": [owner_ref(job)]},
        "spec": rayjob["spec"]["rayClusterSpec"]})
    pods = operator_pods(cluster, env.scheduler.config.scheduler_name)
    assert {p["metadata"]["labels"][POOL_LABEL] for p in pods} == {"rollout", "train"}
    assert "rollmux.io/gang-size" not in pods[0]["metadata"].get("annotations", {})  # sized by the owner
    for pod in pods[:-1]:  # all but one: the gang is incomplete and waits
        env.create_pod(pod)
    wait_for("the gang of 3 waiting for its last pod", lambda: [  # 3: the RayCluster's head + 2 workers
        e for e in env.events(pods[0]["metadata"]["name"]) if e["message"].startswith(f"waiting: 2/3 pods of job '{name}'")])
    assert not any(p["spec"].get("nodeName") for p in env.pods())
    env.create_pod(pods[-1])
    got = wait_for("the gang bound", lambda: bound(env, name))
    assert len(got) == 3
    info = next(j for j in env.client.cluster_state().jobs if j.job == env.qualified(name))
    for pod in pods:
        pool = pod["metadata"]["labels"][POOL_LABEL]
        placed = info.rollout_nodes if pool == "rollout" else info.train_nodes
        assert got[pod["metadata"]["name"]] in placed, (pod["metadata"]["name"], got, info)
    assert set(info.rollout_nodes) == {rollout} and set(info.train_nodes) <= {train, f"{env.tag}-t1"}
    assert all(p["metadata"]["labels"][JOB_LABEL] == name for p in env.pods(name))
