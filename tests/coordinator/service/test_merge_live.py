"""A merge carried out by the live service (issue 14): a real redis-server, the real coordinator process
(`rollmux coordinator --redis`), real node streams, and two jobs driven from threads as a job loop
drives them (a permit per phase, on-policy order, durations reported on release, directives honoured
at iteration boundaries).

Scenario (as `two_lone_jobs` of test_live_policy, at a tenth of a second a phase): A and B (planned
0.2 + 0.6 s, SLO 1.3) cannot share one training node, so each opens a group of its own (g0, g1) on a
fleet of two rollout and three training nodes. Pooling both training nodes in one group with one
rollout node meets both SLOs for less: once their times are learned (3 iterations), the paced
planner directs that pool merge, two directives with one epoch, each switched on its own job's
acknowledgement. The same with planned times ten times the measured ones (learned times are often
far below the worst case planned at admission).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from rollmux.coordinator.service.api import ServiceConfig
from rollmux.coordinator.service.client import CoordinatorClient, JobClient
from rollmux.coordinator.service.runtime import Runtime
from rollmux.model import ClusterSpec, Phase, Pool, Relocation, RelocationState

from .builders import FakeClock
from .conftest import add_node, job_spec
from .test_live_policy import add_jobs, add_nodes, to_boundary
from .test_relocation_live import groups, make_coordinator  # noqa: F401 - make_coordinator: a fixture (real Redis)

PHASE_S = {Phase.ROLLOUT: 0.15, Phase.TRAIN: 0.4, Phase.SYNC: 0.05}
"""What each phase takes on the job's own nodes (below the planned 0.2 + 0.6 s: learned times are shorter)."""
LEARNED_AFTER = 3  # PolicyConfig.learn_min_samples
ITERATIONS = 7


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """One permit a job ran, as the job saw it."""

    job: str
    phase: Phase
    iteration: int
    nodes: tuple[str, ...]
    start_s: float  # wall time the permit was in hand
    end_s: float  # wall time before its release


@dataclass(slots=True)
class JobRun:
    """What one job thread did: its grants, and at each iteration boundary the directive it saw and
    the coordinator's answer to its acknowledgement."""

    job: JobClient
    grants: list[Grant] = field(default_factory=list)
    seen: list[tuple[int, Relocation | None]] = field(default_factory=list)  # (after iteration, directive)
    acks: list[tuple[int, Relocation, str]] = field(default_factory=list)  # (after iteration, answer, note)
    error: BaseException | None = None


def run_job(run: JobRun, learned: threading.Barrier) -> None:
    """The job loop: Rollout, Train, Sync of each iteration in turn; at each boundary (after the Sync,
    before the next Rollout) acknowledge a pending directive. Both jobs release the Sync that makes
    their times learned together, so that both learning events are queued at once."""
    job = run.job
    try:
        for it in range(ITERATIONS):
            for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):
                permit = job.acquire(phase, it, timeout_s=30)  # refused unless it is the job's next phase
                start = time.time()
                # a Train pooled over more training nodes than the job's own runs that much faster
                time.sleep(PHASE_S[phase] / (len(permit.nodes) if phase is Phase.TRAIN else 1))
                end = time.time()
                run.grants.append(Grant(job=job.name, phase=permit.phase, iteration=permit.iteration,
                                        nodes=permit.nodes, start_s=start, end_s=end))
                if phase is Phase.SYNC and it == LEARNED_AFTER - 1:
                    learned.wait(30)
                job.release(permit, end - start)
            directive = job.status().relocation
            run.seen.append((it, directive))
            if directive is not None and directive.state is RelocationState.PENDING:
                run.acks.append((it, *job.ack_relocation(directive.epoch)))
    except BaseException as exc:  # reported by the test
        run.error = exc


@pytest.mark.parametrize("planned_x", [1, 10], ids=["learned-near-planned", "learned-a-tenth-of-planned"])
def test_a_pool_merge_directed_by_the_live_planner_switches_both_jobs_into_one_group(
        make_coordinator, planned_x: int) -> None:  # noqa: F811
    coord = make_coordinator()
    client = CoordinatorClient(coord.address, retry_s=30.0)
    for node_id, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT), ("t0", Pool.TRAIN), ("t1", Pool.TRAIN),
                          ("t2", Pool.TRAIN)):
        add_node(client, node_id, pool)
    runs = {n: JobRun(client.register_job(job_spec(n, t_roll_s=0.2 * planned_x, t_train_s=0.6 * planned_x, slo=1.3)))
            for n in "AB"}
    before = {n: r.job.status() for n, r in runs.items()}
    assert {n: s.group_id for n, s in before.items()} == {"A": "g0", "B": "g1"}
    learned = threading.Barrier(2)
    threads = [threading.Thread(target=run_job, args=(r, learned), daemon=True) for r in runs.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name, r in runs.items():
        assert r.error is None and not any(t.is_alive() for t in threads), (name, r.error)

    # Each job ran every phase of every iteration once, in on-policy order (the coordinator granted
    # exactly the phase asked for), and goes on from there.
    for name, r in runs.items():
        assert [(g.phase, g.iteration) for g in r.grants] == [
            (ph, it) for it in range(ITERATIONS) for ph in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC)], name
        info = r.job.status()
        assert (info.next_phase, info.next_iteration) == (Phase.ROLLOUT, ITERATIONS)

    # No directive before the times were learned; then one pool merge: two directives, one epoch,
    # each SWITCHED on its own job's acknowledgement, into the same new group.
    switched = {}
    for name, r in runs.items():
        assert all(d is None for it, d in r.seen if it < LEARNED_AFTER - 1), (name, r.seen)
        assert all(d.state is not RelocationState.CANCELLED for _, d, _ in r.acks), (name, r.acks)
        done = [(it, d) for it, d, _ in r.acks if d.state is RelocationState.SWITCHED]
        assert len(done) == 1, (name, "no merge switched" if not done else "switched twice", r.seen, r.acks)
        switched[name] = done[0]
    (_, a), (_, b) = switched["A"], switched["B"]
    assert a.epoch == b.epoch and "pool their training nodes" in a.reason
    assert min(a.switched_epoch, b.switched_epoch) > a.epoch and a.switched_epoch != b.switched_epoch  # two switches
    assert (a.from_group, b.from_group) == ("g0", "g1") and a.to_group == b.to_group not in ("g0", "g1")
    assert {n: r.job.status().relocation for n, r in runs.items()} == {"A": a, "B": b}  # as stored, both SWITCHED
    merged = a.to_group
    final = groups(client)
    assert set(final) == {merged} and sorted(final[merged]) == ["A", "B"]  # one group fewer: both in one

    # Each job ran on its old nodes up to its switch and on the merged group's nodes after it.
    for name, (at, d) in switched.items():
        old = {*before[name].rollout_nodes, *before[name].train_nodes}
        new = {*d.rollout_nodes, *d.train_nodes}
        assert all(set(g.nodes) <= old for g in runs[name].grants if g.iteration <= at), name
        assert all(set(g.nodes) <= new for g in runs[name].grants if g.iteration > at), name
    assert a.rollout_nodes == b.rollout_nodes and a.train_nodes == b.train_nodes
    assert len(a.rollout_nodes) == 1 and len(a.train_nodes) == 2  # one rollout node shared, both trainings pooled

    # The nodes the merge does not use are free again (no group, no holder).
    nodes = {n.node_id: n for n in client.cluster_state().nodes}
    kept = {*a.rollout_nodes, *a.train_nodes}
    assert {n for n, v in nodes.items() if v.group_id == merged} == kept
    for n in nodes.keys() - kept:
        assert nodes[n].group_id == "" and not nodes[n].HasField("holder"), n

    # At no time did two jobs hold one node.
    leases = [(g.job, n, g.start_s, g.end_s) for r in runs.values() for g in r.grants for n in g.nodes]
    for i, (j1, n1, s1, e1) in enumerate(leases):
        for j2, n2, s2, e2 in leases[i + 1:]:
            assert not (n1 == n2 and j1 != j2 and s1 < e2 and s2 < e1), (j1, j2, n1)
    client.close()


def test_the_planner_weighs_a_pool_merge_over_what_the_jobs_run_at_their_learned_speed() -> None:
    # The live coordinator assumes `relocation_horizon_s` of run left. A pool merge counts that run in
    # iterations of the planned T_solo, so the horizon it is given is in planned seconds: with the bare
    # horizon, jobs whose learned times were a tenth of their planned ones ran a tenth of the iterations
    # they run in it, and the merge of the live test above was never directed.
    reasons = {}
    for planned_x in (1, 10, 100):
        rt = Runtime(ClusterSpec(), ServiceConfig(), clock=(clock := FakeClock()), wall=clock)
        add_nodes(rt, rollout=2, train=3)
        add_jobs(rt, "AB", t_roll_s=0.2 * planned_x, t_train_s=0.6 * planned_x, slo=1.3)
        for _ in range(LEARNED_AFTER):
            for name in "AB":
                to_boundary(rt, name, tuple(PHASE_S.values()))  # type: ignore[arg-type]
        rec = rt.plan_deferred()
        assert rec is not None and "pool their training nodes" in rec.reason, planned_x
        reasons[planned_x] = rec.reason
    assert len(set(reasons.values())) == 1, reasons  # the same saving whatever the planned times
