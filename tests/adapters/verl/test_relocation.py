"""A real veRL 0.9.1 GRPO job relocated between groups by the real service (Redis-backed coordinator,
four real sidecars: two per pool), through veRL's own checkpoint and resume (docs/how-to/run-verl.md, "Relocation").

As in the tiny job's live test: A and B (driven from here, disaggregated) cannot share a training node
(their training state fills its host DRAM), so B opens g1; C, the veRL job (hybrid engine: co-located on
the training pool), registers itself through train-0's sidecar (the default opt-in, no token) and packs
with A in g0. A leaves once C's trainer loop attached, and the coordinator directs C to g1. C checkpoints
at the end of a Sync, is switched, exits 75; started again on train-1's sidecar without ``ROLLMUX_JOB``,
its driver re-registers under the name in the marker and gets a fresh token (the coordinator's
re-attachment), veRL resumes from that checkpoint and the job runs its remaining steps.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))
import scenario  # noqa: E402
from job import VerlJob, read_jsonl, step_metrics  # noqa: E402

from rollmux.adapters.verl.relocation import EXIT_RELOCATED, MARKER, read_marker  # noqa: E402
from rollmux.core.model import Deployment, JobSpec, Phase  # noqa: E402
from rollmux.shim import env  # noqa: E402
from rollmux.sidecar.gpu import host_dram_bytes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 3


def spec(name: str, train_state: int, deployment: Deployment) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=2.0, t_train_s=1.0, slo=scenario.SLO,
                   model_params_b=0.0001, rollout_state_bytes=1 << 20, train_state_bytes=train_state,
                   deployment=deployment)


def test_a_verl_job_relocated_by_the_service_resumes_on_its_new_node_in_order(verl_workspace) -> None:
    root, assets = verl_workspace
    job = VerlJob(name="C", assets=assets, workdir=root / "C", steps=STEPS)
    with scenario.rollmux_setup(root / "cluster") as cluster:
        client = cluster.client
        sockets = {"train-0": cluster.sockets["train"],
                   **{n: scenario.add_sidecar(cluster, n, p) for n, p in (("rollout-1", "rollout"), ("train-1", "train"))}}
        big = int(0.6 * host_dram_bytes())
        a, b = (client.register_job(spec(n, big, Deployment.DISAGGREGATED)) for n in "AB")

        def leave_once_c_runs(running: dict) -> None:  # once C's trainer attached: a rank hears directives from then
            if not left and any(r.get("event") == "attached" and r.get("job") == "C" for r in read_jsonl(cluster.events)):
                left.append({g.group_id: list(g.jobs) for g in client.cluster_state().groups})
                a.deregister()

        left: list[dict] = []
        opt_in = scenario.opt_in(cluster, "C")  # no token: C registers itself through the sidecar
        first = scenario.run([(job, {**opt_in, env.SIDECAR_SOCKET: sockets["train-0"]})], watch=leave_once_c_runs)
        assert first["C"].rc == EXIT_RELOCATED, (job.workdir / "job.log").read_text()[-3000:]
        marker = read_marker(str(job.workdir / "ckpt" / MARKER))
        assert marker is not None and (marker["job"], marker["to_group"], marker["train_nodes"]) == ("C", "g1", ["train-1"])
        moved_at = marker["iteration"]  # C's next Rollout: its checkpoint is veRL's step `moved_at`
        assert 1 <= moved_at < STEPS and marker["step"] == moved_at and marker["relayed"] is True
        assert left == [{"g0": ["A", "C"], "g1": ["B"]}]  # C self-registered and packed with A
        state = client.cluster_state()
        assert {g.group_id: list(g.jobs) for g in state.groups} == {"g1": ["B", "C"]}  # one group fewer
        freed = {n.node_id: n for n in state.nodes if n.node_id in ("rollout-0", "train-0")}
        assert all(n.group_id == "" and n.holder is None for n in freed.values()), freed
        info = next(j for j in state.jobs if j.job == "C")
        assert (info.next_phase, info.next_iteration, info.relayed_by) == (Phase.ROLLOUT, moved_at, "train-0")

        def relayed_by(running: dict) -> None:  # C re-attached: relayed by its new node's sidecar
            seen.update({j.job: j.relayed_by for j in client.cluster_state().jobs if j.job == "C"})

        seen: dict[str, str] = {}
        shutil.move(job.workdir / "job.log", job.workdir / "job-1.log")
        restart = {k: v for k, v in opt_in.items() if k != env.JOB}  # the name comes from the marker
        second = scenario.run([(job, {**restart, env.SIDECAR_SOCKET: sockets[marker["train_nodes"][0]]})],
                              watch=relayed_by)
        assert second["C"].rc == 0, (job.workdir / "job.log").read_text()[-3000:]
        assert seen == {"C": "train-1"}
        assert [j.job for j in client.cluster_state().jobs] == ["B"]  # C finished and deregistered
        events = read_jsonl(cluster.events)
    shutil.rmtree(job.ray_tmp(), ignore_errors=True)

    owned = [(r["phase"], r["iteration"], r["node"]) for r in scenario.phases(cluster.events) if r["job"] == "C"]
    assert [(p, i) for p, i, _ in owned] == [(p, i) for i in range(STEPS) for p in ("rollout", "train", "sync")]
    assert {n for _, i, n in owned if i < moved_at} == {"train-0"}
    assert {n for _, i, n in owned if i >= moved_at} == {"train-1"}
    assert sorted(step_metrics(job.workdir / "job-1.log")) == list(range(1, moved_at + 1))
    assert sorted(step_metrics(job.workdir / "job.log")) == list(range(moved_at + 1, STEPS + 1))  # resumed, not redone
    kinds = [r["event"] for r in events if r.get("kind") == "adapter" and r["event"].startswith("relocation")]
    assert kinds == ["relocation_checkpoint", "relocation_exit", "relocation_resumed"], kinds
    assert not (job.workdir / "ckpt" / MARKER).exists()  # consumed once the resumed Rollout was granted
