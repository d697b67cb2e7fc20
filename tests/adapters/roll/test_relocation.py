"""A real ROLL RLVR job relocated between groups by the real service (Redis-backed coordinator, four real
sidecars: two per pool), through ROLL's own checkpoint and resume (docs/how-to/run-roll.md, "Relocation").

As in the veRL adapter's test: A and B (registered from here, disaggregated) cannot share a training
node (their training state fills its host DRAM), so B opens g1; C, the ROLL job (actor_infer co-located
with actor_train on the training pool), registers itself through t0's sidecar (the default opt-in, no
token) and packs with A in g0. A leaves once C is built (its gates attached); the coordinator directs C
to g1. ROLL never checkpoints step 0, so C checkpoints at the end of step 1, acknowledges after step 2's
``model_update`` (Sync(1)), is switched and exits 75; started again on t1's sidecar without
``ROLLMUX_JOB`` (and without a token), its driver registers again under the name in the marker and gets
a fresh token (the coordinator's re-attachment), ROLL resumes from that checkpoint and runs step 2.

The scenario runs twice: C an ``RLVRPipeline``, then an ``AgenticPipeline`` (FrozenLake, ROLL's random LLM
proxy), whose rollout schedulers' position (loop seed, episode counters) the adapter saves with the
relocation checkpoint and gives back to the restart: the moved job plays the episodes an unmoved one would.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollmux.adapters.common.relocation import EXIT_RELOCATED, MARKER, read_marker
from rollmux.coordinator.service.redis_store import RedisStore
from rollmux.core.model import Deployment, JobSpec, Phase, Pool
from rollmux.shim import env
from rollmux.sidecar.gpu import host_dram_bytes

from .testbed import Pools, build_assets, launch, phase_records, roll_unavailable, wait_built

_reason = roll_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(_reason is not None, reason=str(_reason))]
STEPS = 3
ORDER = [(p, i) for i in range(STEPS) for p in ("rollout", "train", "sync")][:-1]
"""A 3-step job's phases: the last step's weight push belongs to a step that never runs."""
TRAJECTORIES = "trajectories.jsonl"
"""Where ``harness/run_agentic.py`` appends each step's trajectory groups, in the job's workdir."""


def spec(name: str, train_state: int, deployment: Deployment) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=2.0, t_train_s=1.0, slo=4.0,
                   model_params_b=0.0001, rollout_state_bytes=1 << 20, train_state_bytes=train_state,
                   deployment=deployment)


def started_steps(log: Path) -> list[int]:
    """The steps a driver log shows ROLL starting (RLVR: "pipeline step N start...", agentic: "pipeline rollout
    global step N start...")."""
    return [int(m) for m in re.findall(r"pipeline (?:rollout global )?step (\d+) start", log.read_text(errors="replace"))]


def adapter_records(event_log: Path) -> list[dict]:
    """The adapter's own records (``kind: adapter``) in the event log."""
    rows = (json.loads(line) for line in event_log.read_text().splitlines() if line.strip())
    return [r for r in rows if r.get("kind") == "adapter"]


def stored_relocation(redis_url: str, job: str) -> dict:
    """The coordinator's stored relocation record of `job` (its latest directive), read from Redis."""
    async def load() -> dict[str, str]:
        store = RedisStore(redis_url)
        try:
            return await store.load()
        finally:
            await store.close()

    return json.loads(asyncio.run(load()).get(f"relocation/{job}", "{}"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Moved:
    """What one relocation of C left: the event log, both runs' driver logs and the second run's result."""

    events: Path  # the shim's and the adapter's records (ROLLMUX_EVENT_LOG)
    first_log: Path  # the first run's driver log (left at the move)
    second_log: Path  # the restarted run's driver log
    second: dict[str, Any]  # the restarted run's result (Job.wait)


def relocate(tmp_path: Path, kind: str) -> Moved:
    """Run the scenario of this module's docstring with C a ROLL `kind` ("rlvr" or "agentic") job, checking the
    move itself on the way (exit 75, the marker, the freed nodes, the re-attachment, C's deregistration)."""
    from rollmux.wire.client import CoordinatorClient

    build_assets(tmp_path)
    pools = Pools(tmp_path).start()
    client = CoordinatorClient(pools.coordinator.address, retry_s=2.0)
    try:
        sockets = {"t0": pools.sockets["train"], "t1": pools.add_node("t1", Pool.TRAIN)}
        pools.add_node("r1", Pool.ROLLOUT)
        big = int(0.6 * host_dram_bytes())
        a, _b = (client.register_job(spec(n, big, Deployment.DISAGGREGATED)) for n in "AB")

        events = tmp_path / "events.jsonl"
        opt_in = {**pools.job_env(events), env.JOB: "C"}  # no token: C registers itself through t0's sidecar
        go = tmp_path / "go"
        job = launch("C", tmp_path, kind=kind, steps=STEPS, extra_env=opt_in, start_file=go)
        wait_built([job])  # C's gates are attached: its ranks hear the directive
        assert {g.group_id: list(g.jobs) for g in client.cluster_state().groups} == {"g0": ["A", "C"], "g1": ["B"]}
        a.deregister()
        go.touch()
        first = job.wait(300)
        assert first["rc"] == EXIT_RELOCATED, first["log_tail"]
        marker = read_marker(str(tmp_path / "C" / "ckpt" / MARKER))
        assert marker is not None and (marker["job"], marker["to_group"], marker["train_nodes"]) == ("C", "g1", ["t1"])
        assert (marker["iteration"], marker["step"]) == (2, 2)  # checkpoint of step 1; Rollout(2) next
        assert marker["relayed"] is True
        assert Path(marker["checkpoint"]).name == "checkpoint-1" and Path(marker["checkpoint"]).is_dir()
        state = client.cluster_state()
        assert {g.group_id: list(g.jobs) for g in state.groups} == {"g1": ["B", "C"]}  # one group fewer
        freed = {n.node_id: n for n in state.nodes if n.node_id in ("r0", "t0")}
        assert all(n.group_id == "" and n.holder is None for n in freed.values()), freed
        info = next(j for j in state.jobs if j.job == "C")
        assert (info.next_phase, info.next_iteration, info.relayed_by) == (Phase.ROLLOUT, 2, "t0")
        assert stored_relocation(pools.redis_url, "C")["reattached_by"] == ""

        first_log = tmp_path / "C-1.log"
        shutil.move(job.log, first_log)
        restart = {k: v for k, v in opt_in.items() if k != env.JOB}  # the name comes from the marker
        job2 = launch("C", tmp_path, kind=kind, steps=STEPS, extra_env={**restart, env.SIDECAR_SOCKET: sockets["t1"]})
        reattached = None
        while reattached is None and job2.proc.poll() is None:  # C re-attached: relayed by its new node's sidecar
            if any(j.job == "C" and j.relayed_by == "t1" for j in client.cluster_state().jobs):
                reattached = stored_relocation(pools.redis_url, "C")["reattached_by"]
            time.sleep(0.2)
        second = job2.wait(300)
        assert second["rc"] == 0, second["log_tail"]
        assert reattached == "t1"
        deadline = time.monotonic() + 10
        while [j.job for j in client.cluster_state().jobs] != ["B"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [j.job for j in client.cluster_state().jobs] == ["B"]  # C finished and deregistered
    finally:
        client.close()
        pools.stop()
    assert not (tmp_path / "C" / "ckpt" / MARKER).exists()  # consumed once the resumed Rollout was granted
    return Moved(events=events, first_log=first_log, second_log=job2.log, second=second)


def moved_in_order(moved: Moved) -> None:
    """C's phases are a 3-step job's, in order: iterations 0-1 on t0, iteration 2 on t1."""
    owned = [(r["phase"], r["iteration"], r["node"]) for r in phase_records(moved.events) if r["job"] == "C"]
    assert [(p, i) for p, i, _ in owned] == ORDER
    assert {n for _, i, n in owned if i < 2} == {"t0"} and {n for _, i, n in owned if i >= 2} == {"t1"}
    assert started_steps(moved.first_log) == [0, 1, 2]  # left at step 2's model_update end
    assert started_steps(moved.second_log) == [2]  # resumed, not redone


def test_a_roll_job_relocated_by_the_service_resumes_on_its_new_node_in_order(tmp_path: Path) -> None:
    moved = relocate(tmp_path, "rlvr")
    moved_in_order(moved)
    assert [s["system/step"] for s in moved.second["steps"]] == [0, 1, 2]  # ROLL's restored history, then step 2
    kinds = [r["event"] for r in adapter_records(moved.events) if r["event"].startswith("relocation")]
    assert kinds == ["relocation_checkpoint", "relocation_exit", "relocation_resumed"], kinds


def trajectories(workdir: Path) -> list[tuple[int, int, int]]:
    """(step, episode id, loop seed + group seed) of every trajectory group the harness's agentic job trained on,
    in step order, over both runs (``harness/run_agentic.py``: ``<tag>_<group>_<episode>_<seed>``)."""
    rows = [json.loads(line) for line in (workdir / TRAJECTORIES).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["mode"] == "train"]
    return [(r["step"], int(g.rsplit("_", 2)[1]), int(g.rsplit("_", 2)[2])) for r in rows for g in r["traj_group_ids"]]


def test_an_agentic_roll_job_relocated_by_the_service_continues_its_episodes(tmp_path: Path) -> None:
    moved = relocate(tmp_path, "agentic")
    moved_in_order(moved)
    assert len(moved.second["steps"]) == STEPS  # ROLL's restored history, then step 2
    kinds = [r["event"] for r in adapter_records(moved.events) if r["event"].startswith("relocation")]
    assert kinds == ["relocation_checkpoint", "relocation_exit", "relocation_rollout_restored",
                     "relocation_resumed"], kinds
    # Unmoved, the harness's job (one env group of one env, one trajectory a step) plays episode k at step k,
    # every episode under one seed: the loop seed its scheduler drew at step 0 plus the group seed its config
    # drew. A restart that did not get the schedulers' position back would play episode 0 again at step 2,
    # under freshly drawn seeds (seen before the group seeds were saved too: step 2 under another seed).
    played = trajectories(tmp_path / "C")
    seed = played[0][2]
    assert played == [(k, k, seed) for k in range(STEPS)], played
