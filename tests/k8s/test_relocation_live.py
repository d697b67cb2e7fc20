"""Relocation by restart on Kubernetes, against a real kube-apiserver 1.20.2 and its Job controller.

Jobs are batch/v1 Jobs (gang size from their parallelism; pods split between the pools by the
rollmux.io/*-gpus annotations). Their drivers attach to the registrations the scheduler made, as a
driver does through its node's sidecar. When A leaves, the coordinator directs one of B and C (each
now alone in its group) to the other's group; the directed driver switches at an iteration boundary
and exits (75); its Job's controller recreates the pods and the scheduler binds them to the new nodes.
"""

from __future__ import annotations

from rollmux.core.model import JobSpec, Pool, RelocationState
from rollmux.wire.client import JobClient

from .builders import job_obj
from .conftest import Env, wait_for
from .test_scheduler_live import bound

ANN = {"rollmux.io/rollout-gpus": "8", "rollmux.io/train-gpus": "8", "rollmux.io/slo": "1.5",
       "rollmux.io/t-roll-s": "10", "rollmux.io/t-train-s": "10"}


def spec(name: str) -> JobSpec:
    """The spec a job's driver derives from its config: the one its pods' annotations state, under the
    name the scheduler registered (``<namespace>.<job>``, ROLLMUX_JOB in the examples)."""
    return JobSpec(name=name, n_rollout_gpus=8, n_train_gpus=8, slo=1.5, t_roll_s=10.0, t_train_s=10.0)


def driver(env: Env, job: str) -> JobClient:
    """The job's driver attaching through the sidecar of one of the nodes its pods run on."""
    return env.client.register_job(spec(env.qualified(job)), relay_node=sorted(bound(env, job).values())[0])


def run_iteration(job: JobClient) -> None:
    for _ in range(3):  # Rollout, Train, Sync
        info = job.status()
        job.release(job.acquire(info.next_phase, info.next_iteration, timeout_s=30), 0.0)


def test_a_directed_job_restarts_and_its_new_pods_bind_to_its_new_nodes(env: Env) -> None:
    for name, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN)):
        env.node(name, pool, replicas=2)
    env.start()
    jobs_path = f"/apis/batch/v1/namespaces/{env.ns}/jobs"
    drivers = {}
    for job in ("a", "b", "c"):
        env.kube.create(jobs_path, job_obj(job, ns=env.ns, scheduler=env.scheduler.config.scheduler_name,
                                           annotations=ANN))
        wait_for(f"{job} bound", lambda job=job: bound(env, job))
        drivers[job] = driver(env, job)
    groups = {j.job.split(".", 1)[1]: j.group_id for j in env.client.cluster_state().jobs}
    assert groups["a"] == groups["b"] != groups["c"]
    assert drivers["a"].status().relayed_by  # the driver took the registration over (new token)

    env.kube.delete(f"{jobs_path}/a", propagationPolicy="Background")  # A finishes and leaves
    drivers["a"].deregister()
    moved = wait_for("a directive", lambda: next((j for j in env.client.cluster_state().jobs
                                                  if j.relocation is not None), None))
    moved_job = moved.job.split(".", 1)[1]  # <namespace>.<job>
    old_pods = bound(env, moved_job)
    old_nodes = set(old_pods.values())
    job = drivers[moved_job]
    run_iteration(job)  # the directed job reaches an iteration boundary
    relocation, _ = job.ack_relocation(moved.relocation.epoch)
    assert relocation.state is RelocationState.SWITCHED
    info = job.status()
    new_nodes = {*info.rollout_nodes, *info.train_nodes}
    assert new_nodes != old_nodes

    for pod in old_pods:  # it exits 75; its controller replaces the pods
        env.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/{pod}", gracePeriodSeconds=0)
    got = wait_for("the new pods bound",  # the whole gang again, no old pod among it
                   lambda: (b := bound(env, moved_job)) and len(b) == len(old_pods) and not set(b) & set(old_pods)
                   and b, timeout_s=30)
    assert set(got.values()) == new_nodes
    rollout_pod = next(p for p, n in got.items() if n in info.rollout_nodes)
    assert got[rollout_pod] in info.rollout_nodes
    again = env.client.register_job(spec(moved.job), relay_node=sorted(new_nodes)[0])  # its restarted driver
    assert again.status().group_id == info.group_id
