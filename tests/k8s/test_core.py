"""The scheduler's pure core: node filter, gangs, specs from annotations, assignment (no API server)."""

from __future__ import annotations

import os

import pytest

from rollmux.core.model import Deployment, Pool
from rollmux.k8s import nodefilter
from rollmux.k8s.api import Code, Conventions, Gang, NodeUsage, SchedulerError
from rollmux.k8s.assign import assign, never_fits, refusals
from rollmux.k8s.cache import ClusterCache
from rollmux.k8s.gang import build_gang, group_pending, order_key
from rollmux.k8s.kube import KubeClient, KubeConfig
from rollmux.k8s.objects import milli, node_view, owner_gang_size, pod_requests, pod_view
from rollmux.k8s.scheduler import condition_reason
from rollmux.k8s.spec import gang_spec
from rollmux.k8s.usage import add_pod

from .builders import node_obj, pod_obj


def pod(name: str, job: str | None = "a", **kw):  # type: ignore[no-untyped-def]
    return pod_view(pod_obj(name, job, uid=f"uid-{name}", **kw))


def node(name: str, pool: str = "train", **kw):  # type: ignore[no-untyped-def]
    return node_view(node_obj(name, pool, **kw))


def taken(gpus: int, pods: int, jobs: set[str]) -> NodeUsage:
    """What `pods` bound pods of `jobs` holding `gpus` GPUs take of a node."""
    return NodeUsage(gpus=gpus, pods=pods, jobs=frozenset(jobs), requests=(("nvidia.com/gpu", gpus * 1000),))


def no_owner(ns, owner):  # type: ignore[no-untyped-def]
    raise AssertionError("the owner is not asked when the annotation gives the size")


# ---------------------------------------------------------------------------------------- node filter
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(("node_kw", "pod_kw", "used", "expected"), [
    ({}, {}, NodeUsage(), []),
    ({"ready": False}, {}, NodeUsage(), [nodefilter.NOT_READY]),
    ({"unschedulable": True}, {}, NodeUsage(), [nodefilter.UNSCHEDULABLE]),
    ({"unschedulable": True}, {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
     NodeUsage(), []),
    ({"taints": [GPU_TAINT]}, {}, NodeUsage(),
     ["node(s) had taint {nvidia.com/gpu: present}, that the pod didn't tolerate"]),
    ({"taints": [GPU_TAINT]}, {"tolerations": [{"key": "nvidia.com/gpu", "value": "present"}]}, NodeUsage(), []),
    ({"taints": [GPU_TAINT]}, {"tolerations": [{"key": "nvidia.com/gpu", "value": "absent"}]}, NodeUsage(),
     ["node(s) had taint {nvidia.com/gpu: present}, that the pod didn't tolerate"]),
    ({"taints": [GPU_TAINT]}, {"tolerations": [{"operator": "Exists"}]}, NodeUsage(), []),
    ({"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, {}, NodeUsage(), []),
    ({"taints": [NOT_READY_TAINT]}, {"tolerations": [{"key": "node.kubernetes.io/not-ready",
                                                      "operator": "Exists", "effect": "NoExecute"}]},
     NodeUsage(), ["node(s) had taint {node.kubernetes.io/not-ready: }, that the pod didn't tolerate"]),
    ({}, {}, taken(4, 1, {"b"}), [nodefilter.INSUFFICIENT_GPU, nodefilter.REPLICAS]),
    ({}, {}, taken(4, 1, {"a"}), [nodefilter.INSUFFICIENT_GPU]),
    ({"replicas": 2}, {}, taken(8, 1, {"b"}), []),
    ({"replicas": 2}, {}, taken(8, 2, {"b", "c"}), [nodefilter.REPLICAS]),
    ({"replicas": 3}, {}, taken(16, 2, {"b", "c"}), []),
    ({"replicas": 3}, {}, taken(16, 3, {"b", "c", "d"}), [nodefilter.REPLICAS]),
], ids=["fits", "not-ready", "cordoned", "cordon-tolerated", "taint", "taint-tolerated", "taint-other-value",
        "tolerate-all", "prefer-no-schedule-ignored", "wrong-effect", "gpus-taken", "gpus-taken-by-itself", "time-sliced-second-job",
        "time-sliced-full", "three-replicas", "replicas-count-jobs"])
def test_node_filter_says_what_kube_scheduler_would(node_kw, pod_kw, used, expected) -> None:  # type: ignore[no-untyped-def]
    assert nodefilter.reasons(pod("p", **pod_kw), node("n", **node_kw), used) == expected


def test_node_selector_must_match() -> None:
    p = pod_view({**pod_obj("p", "a"), "spec": {**pod_obj("p", "a")["spec"],
                                                   "nodeSelector": {"rollmux.io/pool": "rollout"}}})
    assert nodefilter.reasons(p, node("t0", "train"), NodeUsage()) == [nodefilter.SELECTOR]
    assert nodefilter.reasons(p, node("r0", "rollout"), NodeUsage()) == []
    assert p.pool is Pool.ROLLOUT  # the pool comes from the selector too


def test_fit_message_has_kube_scheduler_form() -> None:
    msg = nodefilter.fit_message(3, [nodefilter.NOT_READY, nodefilter.INSUFFICIENT_GPU, nodefilter.NOT_READY])
    assert msg == "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) were not ready."
    assert "no nodes available" in nodefilter.fit_message(0, [])


# ---------------------------------------------------------------------------------------- gangs
def test_pods_group_per_job_and_bad_names_are_set_apart() -> None:
    groups, bad = group_pending([pod("a-0"), pod("a-1"), pod("b-0", "b"), pod("x", None), pod("y", "no/slash")])
    assert {k: [p.name for p in v] for k, v in groups.items()} == {("default", "a"): ["a-0", "a-1"],
                                                                   ("default", "b"): ["b-0"]}
    assert [(p.name, "rollmux.io/job" in why) for p, why in bad] == [("x", True), ("y", True)]


@pytest.mark.parametrize(("kind", "obj", "size"), [
    ("Job", {"spec": {"parallelism": 3}}, 3),
    ("Job", {"spec": {}}, 1),
    ("Job", {"spec": {"parallelism": 4, "completions": 4}, "status": {"succeeded": 3}}, 1),
    ("RayCluster", {"spec": {"workerGroupSpecs": [{"replicas": 2}, {"replicas": 1, "numOfHosts": 2}]}}, 5),
    ("RayCluster", {"spec": {"workerGroupSpecs": [{"replicas": 0, "minReplicas": 2, "maxReplicas": 4}]}}, 3),
    ("RayCluster", {"spec": {"suspend": True, "workerGroupSpecs": [{"replicas": 2}]}}, 0),
    ("RayJob", {"spec": {"rayClusterSpec": {"workerGroupSpecs": [{"replicas": 1}]}}}, 2),
], ids=["job-parallelism", "job-default", "job-completions-left", "raycluster", "raycluster-min", "suspended",
        "rayjob"])
def test_gang_size_from_the_owner(kind, obj, size) -> None:  # type: ignore[no-untyped-def]
    assert owner_gang_size(kind, obj) == size


def test_gang_size_annotation_wins_and_must_parse() -> None:
    g = build_gang("default", "a", [pod("a-1", annotations={"rollmux.io/gang-size": "2"})], no_owner)
    assert (g.size, g.complete) == (2, False)
    for raw in ("two", "0", "-1"):
        with pytest.raises(SchedulerError, match="gang-size") as exc:
            build_gang("default", "a", [pod("a-1", annotations={"rollmux.io/gang-size": raw})], no_owner)
        assert exc.value.reason is Code.BAD_INPUT
    with pytest.raises(SchedulerError, match="disagree"):
        build_gang("default", "a", [pod("a-0", annotations={"rollmux.io/gang-size": "2"}),
                                    pod("a-1", annotations={"rollmux.io/gang-size": "3"})], no_owner)
    with pytest.raises(SchedulerError, match="no single controller"):
        build_gang("default", "a", [pod("a-0")], no_owner)
    sized = build_gang("default", "a", [pod("a-0", owner=("Job", "a"))], lambda ns, o: 2 if o.kind == "Job" else 0)
    assert sized.size == 2


# ---------------------------------------------------------------------------------------- specs
def gang_of(*pods):  # type: ignore[no-untyped-def]
    return Gang(namespace="default", job=pods[0].job, pods=tuple(pods), size=len(pods))


def test_spec_from_annotations_and_gpu_requests() -> None:
    ann = {"rollmux.io/slo": "1.5", "rollmux.io/t-roll-s": "30", "rollmux.io/t-train-s": "20",
           "rollmux.io/model-params-b": "7", "rollmux.io/max-tokens": "4096",
           "rollmux.io/deployment": "disaggregated", "rollmux.io/gang-size": "3"}
    gs = gang_spec(gang_of(pod("a-0", pool="rollout", annotations=ann), pod("a-1", pool="train", annotations=ann),
                           pod("a-2", pool="train", gpus=4, annotations=ann)))
    s = gs.spec
    assert (s.name, s.n_rollout_gpus, s.n_train_gpus, s.slo, s.t_roll_s, s.t_train_s, s.max_tokens,
            s.deployment) == ("a", 8, 12, 1.5, 30.0, 20.0, 4096, Deployment.DISAGGREGATED)
    assert gs.defaults == ()
    assert [(p.name, pool) for p, pool in gs.pools] == [("a-0", Pool.ROLLOUT), ("a-1", Pool.TRAIN),
                                                         ("a-2", Pool.TRAIN)]


def test_missing_annotations_are_left_to_the_profiler_and_named() -> None:
    gs = gang_spec(gang_of(pod("a-0", pool="rollout"), pod("a-1", pool="train")))
    assert gs.spec.t_roll_s is None and gs.spec.slo == 1.2
    assert gs.defaults == ("slo", "t_roll_s", "t_train_s", "model_params_b", "max_tokens")


def test_unlabelled_pods_fill_rollout_then_training_by_the_gpu_annotations() -> None:
    ann = {"rollmux.io/rollout-gpus": "8", "rollmux.io/train-gpus": "16"}
    gs = gang_spec(gang_of(*(pod(f"a-{i}", annotations=ann) for i in range(3))))
    assert [pool for _, pool in gs.pools] == [Pool.ROLLOUT, Pool.TRAIN, Pool.TRAIN]
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus) == (8, 16)


@pytest.mark.parametrize(("pods", "match"), [
    ([{"annotations": {"rollmux.io/slo": "fast"}}], "does not parse"),
    ([{"annotations": {"rollmux.io/slo": "0.5"}}], "slo"),
    ([{"annotations": {"rollmux.io/deployment": "sideways"}}], "deployment"),
    ([{"annotations": {"rollmux.io/rollout-gpus": "eight"}}], "whole number"),
    ([{"annotations": {"rollmux.io/slo": "2"}}, {"annotations": {"rollmux.io/slo": "3"}}], "different"),
    ([{"annotations": {"rollmux.io/rollout-gpus": "8", "rollmux.io/train-gpus": "16"}}], "ask for 8 and 16"),
    ([{"gpus": 0}, {"gpus": 0}], "requests GPUs"),
], ids=["slo-text", "slo-range", "deployment", "gpu-count", "pods-disagree", "gpus-do-not-add-up", "no-gpus"])
def test_bad_annotations_are_bad_input(pods, match) -> None:  # type: ignore[no-untyped-def]
    views = [pod(f"a-{i}", pool="rollout" if i == 0 else "train", **kw) for i, kw in enumerate(pods)]
    if len(views) == 1:
        views.append(pod("a-9", pool="train", annotations=pods[0].get("annotations")))
    with pytest.raises(SchedulerError, match=match) as exc:
        gang_spec(gang_of(*views))
    assert exc.value.reason is Code.BAD_INPUT


def test_a_gpu_request_that_is_not_whole_does_not_parse() -> None:
    with pytest.raises(SchedulerError, match="not a whole number"):
        pod("a-0", gpu_raw="1.5")


# ---------------------------------------------------------------------------------------- assignment
NODES = {n.name: n for n in (node("t0"), node("t1"), node("r0", "rollout"), node("r1", "rollout"))}
PLACED = {Pool.ROLLOUT: ("r1",), Pool.TRAIN: ("t0", "t1")}


def test_each_pod_binds_to_a_node_of_its_pool_in_the_placement() -> None:
    pools = [(pod("a-0"), Pool.ROLLOUT), (pod("a-1"), Pool.TRAIN), (pod("a-2"), Pool.TRAIN)]
    d = assign("a", pools, PLACED, NODES, {}, explain="placed")
    assert [(b.pod.name, b.node) for b in d.bindings] == [("a-0", "r1"), ("a-1", "t0"), ("a-2", "t1")]


def test_a_gang_reserves_as_it_goes_and_binds_all_or_nothing() -> None:
    pools = [(pod("a-0"), Pool.ROLLOUT), (pod("a-1"), Pool.ROLLOUT)]  # two 8-GPU pods, one 8-GPU node
    d = assign("a", pools, PLACED, NODES, {}, explain="placed in g0")
    assert not d.bound and d.code is Code.UNSCHEDULABLE
    assert "pod a-1 fits none of its rollout nodes (r1)" in d.message
    assert "1 Insufficient nvidia.com/gpu" in d.message


def test_small_pods_of_one_job_share_a_node_within_its_physical_gpus() -> None:
    pools = [(pod(f"a-{i}", gpus=4), Pool.TRAIN) for i in range(4)]
    d = assign("a", pools, {Pool.TRAIN: ("t0", "t1")}, NODES, {}, explain="placed")
    assert [b.node for b in d.bindings] == ["t0", "t1", "t0", "t1"]


def test_time_slicing_lets_a_second_job_share_a_node() -> None:
    nodes = {"t0": node("t0", replicas=2)}
    used = {"t0": taken(8, 1, {"b"})}
    assert assign("a", [(pod("a-0"), Pool.TRAIN)], {Pool.TRAIN: ("t0",)}, nodes, used, explain="x").bound
    used = {"t0": taken(8, 1, {"b"})}
    unsliced = {"t0": node("t0")}
    assert not assign("a", [(pod("a-0"), Pool.TRAIN)], {Pool.TRAIN: ("t0",)}, unsliced, used, explain="x").bound


def test_a_cordoned_or_missing_node_keeps_the_gang_waiting() -> None:
    nodes = {**NODES, "t0": node("t0", unschedulable=True)}
    d = assign("a", [(pod("a-0"), Pool.TRAIN)], {Pool.TRAIN: ("t0",)}, nodes, {}, explain="x")
    assert "1 node(s) were unschedulable" in d.message
    d = assign("a", [(pod("a-0"), Pool.TRAIN)], {Pool.TRAIN: ("t9",)}, NODES, {}, explain="x")
    assert "1 node(s) not found" in d.message


def test_a_colocated_job_runs_its_rollout_pods_on_its_training_nodes() -> None:
    d = assign("a", [(pod("a-0"), Pool.ROLLOUT)], {Pool.ROLLOUT: (), Pool.TRAIN: ("t1",)}, NODES, {}, explain="x")
    assert [b.node for b in d.bindings] == ["t1"]


def test_a_pod_bigger_than_every_node_of_its_pool_never_fits() -> None:
    assert never_fits([(pod("a-0"), Pool.TRAIN)], NODES) == ""
    why = never_fits([(pod("a-0", gpus=16), Pool.TRAIN)], NODES)
    assert "requests 16 nvidia.com/gpu but the largest train node has 8 GPUs" in why


def test_a_colocated_job_asks_for_its_gpus_in_both_phases_on_one_pool() -> None:
    ann = {"rollmux.io/deployment": "colocated-train"}
    gs = gang_spec(gang_of(pod("a-0", annotations=ann), pod("a-1", annotations=ann)))
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus) == (16, 16)
    assert {pool for _, pool in gs.pools} == {Pool.TRAIN}


def test_a_pod_without_gpus_goes_with_training() -> None:
    ann = {"rollmux.io/rollout-gpus": "8"}
    gs = gang_spec(gang_of(pod("a-head", gpus=0, annotations=ann), pod("a-w0", annotations=ann),
                           pod("a-w1", annotations=ann)))
    assert [(p.name, pool) for p, pool in gs.pools] == [("a-head", Pool.TRAIN), ("a-w0", Pool.ROLLOUT),
                                                         ("a-w1", Pool.TRAIN)]
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus) == (8, 8)


def test_a_replacement_pod_takes_the_pool_its_bound_sibling_leaves_whatever_the_names_sort_as() -> None:
    """A Job's controller replaces a relocated job's pods one by one: while one replacement is bound (to a
    rollout node) the other is pending, and it must get training, even though its name sorts first."""
    ann = {"rollmux.io/rollout-gpus": "8", "rollmux.io/train-gpus": "8"}
    bound_obj = pod_obj("a-zz", "a", uid="uid-a-zz", annotations=ann)
    bound_obj["spec"]["nodeName"] = "r1"
    gang = gang_of(pod("a-00", annotations=ann), pod_view(bound_obj))
    gs = gang_spec(gang, {"r1": Pool.ROLLOUT, "t1": Pool.TRAIN})
    assert [(p.name, pool) for p, pool in gs.pools] == [("a-00", Pool.TRAIN), ("a-zz", Pool.ROLLOUT)]
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus) == (8, 8)
    # without the nodes' pools, the split goes by gang order, and gives the pending pod rollout
    assert [pool for _, pool in gang_spec(gang).pools] == [Pool.ROLLOUT, Pool.TRAIN]


# ---------------------------------------------------------------------------------------- fit like kubelet
def with_spec(name: str, **spec):  # type: ignore[no-untyped-def]
    """A pod of job a whose spec gets `spec` merged in (a container's requests via `requests`)."""
    obj = pod_obj(name, "a", uid=f"uid-{name}")
    req = spec.pop("requests", None)
    if req is not None:
        obj["spec"]["containers"][0]["resources"]["requests"].update(req)
    obj["spec"].update(spec)
    return pod_view(obj)


@pytest.mark.parametrize(("raw", "expected"), [("500m", 500), ("2", 2000), ("1.5", 1500), ("64Gi", 64 * 2**30 * 1000),
                                                ("100M", 10**11), ("1e3", 10**6), (4, 4000), ("1u", 1)])
def test_quantities_parse_as_the_api_server_writes_them(raw, expected) -> None:  # type: ignore[no-untyped-def]
    assert milli(raw, "q") == expected


def test_a_pod_requests_its_containers_its_largest_init_container_and_its_overhead() -> None:
    obj = pod_obj("p", "a", gpus=2)
    obj["spec"]["containers"].append({"name": "side", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}})
    obj["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "4", "memory": "8Gi"})
    obj["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "8"}}}]
    obj["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    reqs = pod_requests(obj["spec"])
    assert reqs["cpu"] == 8250 and reqs["memory"] == (9 * 2**30 + 120 * 2**20) * 1000
    assert reqs["nvidia.com/gpu"] == 2000


def test_every_requested_resource_counts_against_allocatable_minus_bound_pods() -> None:
    n = node("n")  # 64 CPUs, 512Gi
    big = with_spec("p", requests={"cpu": "40"})
    assert nodefilter.reasons(big, n, NodeUsage()) == []
    used = add_pod(NodeUsage(), with_spec("q", requests={"cpu": "30"}), "b")
    assert nodefilter.reasons(big, node("n", replicas=2), used) == ["Insufficient cpu"]
    odd = with_spec("r", requests={"example.com/fpga": "1"})
    assert nodefilter.reasons(odd, n, NodeUsage()) == ["Insufficient example.com/fpga"]


def test_required_node_affinity_and_host_ports_are_checked() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    p = with_spec("p", affinity=aff)
    assert nodefilter.reasons(p, node("n"), NodeUsage()) == [nodefilter.SELECTOR]
    zoned = node_view({**node_obj("n", "train"), "metadata": {"name": "n", "labels": {"zone": "a",
                                                                                       "rollmux.io/pool": "train"}}})
    assert nodefilter.reasons(p, zoned, NodeUsage()) == []
    by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n"]}]}]}}}
    assert nodefilter.reasons(with_spec("p", affinity=by_name), node("n"), NodeUsage()) == [nodefilter.SELECTOR]
    ports = {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}
    a, b = with_spec("a", **ports), with_spec("b", **ports)
    assert nodefilter.reasons(b, node("n", replicas=2), add_pod(NodeUsage(), a, "x")) == [nodefilter.PORTS]


def test_a_pod_asking_more_cpu_than_any_node_never_fits() -> None:
    why = never_fits([(with_spec("p", requests={"cpu": "100", "memory": "1Gi"}), Pool.TRAIN)], NODES)
    assert "requests 100 cpu but the largest train node allocates 64" in why
    why = never_fits([(with_spec("p", requests={"memory": "1Ti"}), Pool.TRAIN)], NODES)
    assert "requests 1024Gi memory but the largest train node allocates 512Gi" in why


def test_a_renamed_shared_gpu_resource_and_a_custom_pool_label_come_from_the_conventions() -> None:
    conv = Conventions(gpu_resource="nvidia.com/gpu.shared", pool_label="example.com/pool")
    obj = pod_obj("p", "a", gpus=0)
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": "4"}}
    obj["spec"]["nodeSelector"] = {"example.com/pool": "rollout"}
    v = pod_view(obj, conv)
    assert (v.gpus, v.pool) == (4, Pool.ROLLOUT)
    n = node_obj("n", "x", gpus=0)
    n["metadata"]["labels"] = {"example.com/pool": "rollout", "nvidia.com/gpu.replicas": "4"}
    n["status"]["allocatable"]["nvidia.com/gpu.shared"] = "32"
    nv = node_view(n, conv)
    assert (nv.pool, nv.physical_gpus, nv.replicas) == (Pool.ROLLOUT, 8, 4)
    assert nodefilter.reasons(v, nv, NodeUsage()) == []


# ---------------------------------------------------------------------------------------- siblings, refusals
def test_a_bound_sibling_counts_in_the_jobs_share_of_its_node() -> None:
    """Replacements of a time-sliced job never stack past its physical GPUs on one node."""
    nodes = {"t0": node("t0", replicas=4), "t1": node("t1", replicas=4)}
    sib = pod_obj("a-0", "a", uid="uid-a-0")
    sib["spec"]["nodeName"] = "t0"
    sibling = pod_view(sib)
    used = {"t0": add_pod(NodeUsage(), sibling, "a")}
    pools = [(sibling, Pool.TRAIN), (pod("a-1"), Pool.TRAIN)]
    d = assign("a", pools, {Pool.TRAIN: ("t0", "t1")}, nodes, used, explain="x")
    assert [(b.pod.name, b.node) for b in d.bindings] == [("a-1", "t1")]
    d = assign("a", pools, {Pool.TRAIN: ("t0",)}, nodes, used, explain="x")
    assert not d.bound and "Insufficient nvidia.com/gpu" in d.message


def test_refused_nodes_are_the_ones_no_pod_may_use_whatever_they_hold() -> None:
    nodes = {"t0": node("t0", unschedulable=True), "t1": node("t1"), "r0": node("r0", "rollout", ready=False)}
    pools = [(pod("a-0"), Pool.TRAIN), (pod("a-1"), Pool.ROLLOUT)]
    got = refusals(pools, {Pool.TRAIN: ("t0", "t1"), Pool.ROLLOUT: ("r0", "r9")}, nodes)
    assert {(r.node, r.reasons) for r in got} == {("t0", (nodefilter.UNSCHEDULABLE,)), ("r0", (nodefilter.NOT_READY,)),
                                                  ("r9", (nodefilter.UNKNOWN,))}


# ---------------------------------------------------------------------------------------- groups, order
def test_a_podgroup_sizes_the_gang_and_names_the_job() -> None:
    labels = {"scheduling.x-k8s.io/pod-group": "raycluster-a"}
    pods = [pod_view(pod_obj(f"w{i}", None, uid=f"u{i}", labels=labels)) for i in range(3)]
    assert {p.job for p in pods} == {"raycluster-a"}
    asked = []

    def size(ns, owner):  # type: ignore[no-untyped-def]
        asked.append(owner)
        return owner_gang_size(owner.kind, {"spec": {"minMember": 3}})

    g = build_gang("default", "raycluster-a", pods, size, name="default.raycluster-a")
    assert g.complete and g.size == 3 and g.qualified == "default.raycluster-a"
    assert asked[0].kind == "PodGroup" and asked[0].name == "raycluster-a"


def test_gangs_go_by_priority_then_age() -> None:
    def p(name: str, prio: int, created: str):  # type: ignore[no-untyped-def]
        obj = pod_obj(name, name)
        obj["spec"]["priority"] = prio
        obj["metadata"]["creationTimestamp"] = created
        return pod_view(obj)

    gangs = {"old": [p("old", 0, "2024-01-01T00:00:00Z")], "new": [p("new", 0, "2024-01-02T00:00:00Z")],
             "urgent": [p("urgent", 100, "2024-01-03T00:00:00Z")]}
    assert sorted(gangs, key=lambda k: order_key(gangs[k])) == ["urgent", "old", "new"]


def test_gated_pods_are_seen_and_waiting_reasons_do_not_read_as_missing_capacity() -> None:
    obj = pod_obj("p", "a")
    obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert pod_view(obj).gates == ("kueue.x-k8s.io/admission",)
    assert condition_reason(Code.GATED) == "SchedulingGated"
    assert condition_reason(Code.UNSCHEDULABLE) == "Unschedulable"
    for code in (Code.QUEUED, Code.INCOMPLETE, Code.BIND_FAILED, Code.COORDINATOR):
        assert condition_reason(code) == "WaitingForGang"


def test_a_jobs_name_at_the_coordinator_is_qualified_by_its_namespace() -> None:
    conv = Conventions()
    assert conv.qualified("team-a", "train7b") != conv.qualified("team-b", "train7b")
    ann = {"rollmux.io/gang-size": "2"}
    g = build_gang("team-a", "a", [pod("a-0", pool="rollout", annotations=ann),
                                   pod("a-1", pool="train", annotations=ann)], no_owner,
                   name=conv.qualified("team-a", "a"))
    assert gang_spec(g).spec.name == "team-a.a"


def test_a_relist_is_swapped_in_whole_and_keeps_a_binding_the_list_does_not_show_yet() -> None:
    cache = ClusterCache()
    a, b = pod_obj("a", "a", uid="ua"), pod_obj("b", "b", uid="ub")
    cache.replace_pods([a, b])
    cache.assume(cache.pods["ua"], "t0")  # bound by the scheduler; the list below predates it
    seen: list[int] = []
    real_lock = cache._lock

    class Spy:
        def __enter__(self):  # type: ignore[no-untyped-def]
            real_lock.__enter__()
            seen.append(len(cache.pods))

        def __exit__(self, *exc):  # type: ignore[no-untyped-def]
            return real_lock.__exit__(*exc)

    cache._lock = Spy()  # type: ignore[assignment]
    cache.replace_pods([a, pod_obj("c", "c", uid="uc")])
    assert seen == [2]  # one swap under the lock, never a half-filled map
    assert {u: p.node_name for u, p in cache.pods.items()} == {"ua": "t0", "uc": ""}


def test_a_jobs_own_pods_on_a_time_sliced_node_are_its_own_under_its_qualified_name() -> None:
    n = node("t0", replicas=2)
    sib = pod_obj("a-0", "a", uid="uid-a-0", gpus=4)
    sib["spec"]["nodeName"] = "t0"
    used = add_pod(add_pod(NodeUsage(), pod_view(sib), "ns.a"), pod("b-0", "b", gpus=4), "ns.b")
    d = assign("ns.a", [(pod_view(sib), Pool.TRAIN), (pod("a-1", gpus=4), Pool.TRAIN)], {Pool.TRAIN: ("t0",)},
               {"t0": n}, {"t0": used}, explain="x")
    assert [(b.pod.name, b.node) for b in d.bindings] == [("a-1", "t0")]  # two jobs there, one of them its own


def test_the_token_file_is_read_again_when_it_rotates(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "token"
    f.write_text("first\n")
    kube = KubeClient(KubeConfig(server="https://127.0.0.1:1", token_file=str(f)))
    assert kube.token() == "first" and kube._headers()["Authorization"] == "Bearer first"
    f.write_text("second\n")  # the kubelet rotates a bound token by replacing the file
    os.utime(f, ns=(1, 10**18))
    assert kube.token() == "second"
