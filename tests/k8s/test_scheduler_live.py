"""The scheduler against a real kube-apiserver 1.20.2 (conftest.py says why that version) and a real
gRPC coordinator: gangs into co-execution groups, waiting with an explanation, bad input.

Scenario: two rollout and two training nodes, each GPU time-sliced two ways. A and B (complementary:
SLO 1.2, equal phases) share group g0; C would slow them past their SLO, so it opens g1; D (SLO 1.0)
shares with nobody and no free nodes remain, so it waits until C leaves.
"""

from __future__ import annotations

from typing import Any

from rollmux.core.model import Pool

from .builders import pod_obj
from .conftest import Env, wait_for


def gang(env: Env, job: str, *, slo: float, **ann: str) -> None:
    """A job's pods: one rollout and one training pod of 8 GPUs."""
    annotations = {"rollmux.io/gang-size": "2", "rollmux.io/slo": str(slo), "rollmux.io/t-roll-s": "10",
                   "rollmux.io/t-train-s": "10", **ann}
    for pool in ("rollout", "train"):
        env.create_pod(pod_obj(f"{job}-{pool}", job, pool=pool, annotations=annotations, ns=env.ns))


def bound(env: Env, job: str) -> dict[str, str]:
    """Pod name -> node, once every pod of `job` is bound (else {})."""
    pods = env.pods(job)
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
    return nodes if pods and all(nodes.values()) else {}


def placement(env: Env, job: str) -> dict[str, str]:
    info = next(j for j in env.client.cluster_state().jobs if j.job == env.qualified(job))
    assert len(info.rollout_nodes) == len(info.train_nodes) == 1
    return {f"{job}-rollout": info.rollout_nodes[0], f"{job}-train": info.train_nodes[0]}


def group_of(env: Env, job: str) -> str:
    return next(j.group_id for j in env.client.cluster_state().jobs if j.job == env.qualified(job))


def condition(pod: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or () if c["type"] == "PodScheduled"), {})


def test_gangs_bind_where_the_coordinator_places_them_and_a_gang_that_does_not_fit_waits(env: Env) -> None:
    for name, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN)):
        env.node(name, pool, replicas=2)
    env.start()
    for job in ("a", "b", "c"):
        gang(env, job, slo=1.2)
        got = wait_for(f"{job} bound", lambda job=job: bound(env, job))
        assert got == placement(env, job)  # bindings equal the coordinator's placement
    assert group_of(env, "a") == group_of(env, "b") != group_of(env, "c")
    a, b, c = (bound(env, j) for j in "abc")
    assert a["a-train"] == b["b-train"] != c["c-train"]  # A and B time-share their training node
    assert wait_for("a's event", lambda: [e for e in env.events("a-train") if e["reason"] == "Scheduled"])[0][
        "message"].startswith(f"placed in group {group_of(env, 'a')} on {a['a-train']}, {a['a-rollout']}: ")

    gang(env, "d", slo=1.0)  # nobody shares with it, and no free nodes remain
    waiting = wait_for("d's event", lambda: [e for e in env.events("d-train") if e["reason"] == "FailedScheduling"])
    assert waiting[0]["type"] == "Warning"
    assert waiting[0]["message"].startswith("waiting: position 1 in the coordinator's admission queue")
    cond = wait_for("d's condition", lambda: condition(env.kube.get(f"/api/v1/namespaces/{env.ns}/pods/d-train")))
    assert (cond["status"], cond["reason"]) == ("False", "WaitingForGang")  # queued: no node is missing
    assert not any(p["spec"].get("nodeName") for p in env.pods("d"))
    before_c = bound(env, "c")

    env.client.remove_job(env.qualified("c"))  # C leaves: its controller deletes its pods
    for pod in ("c-rollout", "c-train"):
        env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/{pod}", gracePeriodSeconds=0)
    got = wait_for("d bound", lambda: bound(env, "d"))
    assert got == placement(env, "d")
    assert set(got.values()) == set(before_c.values())  # the nodes C freed
    assert bound(env, "a") == a and bound(env, "b") == b  # nothing else moved


def test_bad_input_waits_with_an_event_and_changes_nothing(env: Env) -> None:
    env.node("r0", Pool.ROLLOUT)
    env.node("t0", Pool.TRAIN)
    env.start()
    env.create_pod(pod_obj("nameless", None, ns=env.ns, annotations={"rollmux.io/gang-size": "1"}))
    ann = {"rollmux.io/gang-size": "2", "rollmux.io/slo": "fast"}
    for pool in ("rollout", "train"):
        env.create_pod(pod_obj(f"bad-{pool}", "bad", pool=pool, ns=env.ns, annotations=ann))
    big = {"rollmux.io/gang-size": "2"}
    env.create_pod(pod_obj("big-rollout", "big", pool="rollout", ns=env.ns, annotations=big))
    env.create_pod(pod_obj("big-train", "big", pool="train", gpus=16, ns=env.ns, annotations=big))
    env.create_pod(pod_obj("half-0", "half", pool="train", ns=env.ns, annotations={"rollmux.io/gang-size": "2"}))

    def said(pod: str, text: str) -> bool:
        return any(text in e["message"] and e["type"] == "Warning" for e in env.events(pod))

    wait_for("nameless explained", lambda: said("nameless", "has no rollmux.io/job label"))
    wait_for("bad explained", lambda: said("bad-train", "rollmux.io/slo='fast'"))
    wait_for("big explained", lambda: said("big-train", "it can never fit"))
    wait_for("half explained", lambda: said("half-0", "1/2 pods of job 'half' exist"))
    env.scheduler.explainer.flush()
    assert all(not p["spec"].get("nodeName") for p in env.pods())
    state = env.client.cluster_state()
    assert (state.jobs, state.groups) == ((), ())  # the coordinator never heard of them
    # each explanation is told once, however many cycles ran since
    assert len([e for e in env.events("bad-train") if e["reason"] == "FailedScheduling"]) == 1
