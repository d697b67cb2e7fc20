"""Merges carried out by the live service: a real redis-server, the real coordinator process
(`rollmux coordinator --redis`), real node streams, and two jobs driven from threads as a job loop
drives them (a permit per phase, on-policy order, durations reported on release, directives honoured
at iteration boundaries).

Scenarios, at a tenth of a second a phase; in each, A and B first open a group of their own (g0, g1)
and, once their times are learned (3 iterations), the paced planner directs a merge: two directives
with one epoch, each switched on its own job's acknowledgement.

- Pool merge (as `two_lone_jobs` of test_live_policy): A and B (planned 0.2 + 0.6 s, SLO 1.3) cannot
  share one training node; pooling both training nodes in one group with one rollout node meets both
  SLOs for less. The same with planned times ten times the measured ones (learned times are often
  far below the worst case planned at admission).
- Pair merge (deployment modes on): a rollout-heavy and a train-heavy job each run co-located on a
  training node of their own; one disaggregated group sharing one rollout and one training node costs
  less.
- The second half first: A trains on two nodes, so it opens the pooled group whichever job
  acknowledges first; B is made to acknowledge first, is told to wait, runs on in its old group and
  joins at its next boundary after A switched.
- The second half never acknowledges (a trainer without the relocation hook): A opens the merged
  group, B's directive expires at its deadline, B keeps its group and nodes, A keeps a group of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from rollmux.coordinator.service.runtime import Runtime
from rollmux.coordinator.service.runtime.api import ServiceConfig
from rollmux.core.model import ClusterSpec, JobSpec, Phase, Relocation, RelocationState
from rollmux.wire.client import CoordinatorClient, JobClient, JobInfo

from .builders import FakeClock
from .conftest import add_nodes as add_node_streams
from .conftest import job_spec
from .test_live_policy import add_jobs, add_nodes, to_boundary
from .test_relocation_live import groups, make_coordinator  # noqa: F401 - make_coordinator: a fixture (real Redis)

PHASE_S = {Phase.ROLLOUT: 0.15, Phase.TRAIN: 0.4, Phase.SYNC: 0.05}
"""What each phase takes on the job's own nodes (below the planned 0.2 + 0.6 s: learned times are shorter)."""
LEARNED_AFTER = 3  # PolicyConfig.learn_min_samples
ITERATIONS = 7
PHASES = (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Two jobs that each open a group of their own on a fixed fleet, and the merge the planner directs."""

    specs: tuple[JobSpec, ...]  # registered in this order: the first opens g0, the second g1
    phase_s: dict[str, dict[Phase, float]]  # job -> what each phase takes on its own nodes, s
    fleet: tuple[int, int] = (2, 3)  # rollout, training nodes
    flags: tuple[str, ...] = ()  # of the coordinator
    reason: str = "pool their training nodes"  # in the directives' reason
    merged: tuple[int, int] = (1, 2)  # rollout, training nodes of the merged group


def pool_merge(planned_x: int) -> Scenario:
    return Scenario(specs=tuple(replace(job_spec(n, t_roll_s=0.2 * planned_x, t_train_s=0.6 * planned_x, slo=1.3), elastic=True)
                                for n in "AB"),  # elastic: a pool merge stretches their Trains
                    phase_s={n: PHASE_S for n in "AB"})


def pair_merge() -> Scenario:
    """A (planned 0.4 + 0.2 s) and B (0.2 + 0.4 s), SLO 1.5, a small model: alone, each is cheapest
    co-located on one training node; together, one rollout and one training node carry both."""
    times = {"A": (0.4, 0.2), "B": (0.2, 0.4)}
    specs = tuple(JobSpec(name=n, n_rollout_gpus=8, n_train_gpus=8, t_roll_s=r, t_train_s=t, slo=1.5,
                          model_params_b=0.001, rollout_state_bytes=10**9, train_state_bytes=10**9)
                  for n, (r, t) in times.items())
    return Scenario(specs=specs, fleet=(2, 2), flags=("--deployment-modes",), reason="share one group",
                    merged=(1, 1),
                    phase_s={n: {Phase.ROLLOUT: 0.75 * r, Phase.TRAIN: 0.75 * t, Phase.SYNC: 0.05}
                             for n, (r, t) in times.items()})


def uneven_pool_merge() -> Scenario:
    """A (planned 0.1 + 0.3 s on two training nodes) and B (0.1 + 0.15 s on one), SLO 1.3: the pool
    of all three training nodes, opened by A (the larger training pool), meets both SLOs for less."""
    times = {"A": (16, 0.3), "B": (8, 0.15)}
    specs = tuple(JobSpec(name=n, n_rollout_gpus=8, n_train_gpus=gpus, t_roll_s=0.1, t_train_s=t, slo=1.3,
                          rollout_state_bytes=10**9, train_state_bytes=10**9, elastic=True) for n, (gpus, t) in times.items())
    return Scenario(specs=specs, fleet=(3, 4), merged=(1, 3),
                    phase_s={n: {Phase.ROLLOUT: 0.075, Phase.TRAIN: 0.75 * t, Phase.SYNC: 0.05}
                             for n, (_, t) in times.items()})


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
    phase_s: dict[Phase, float]  # what each phase takes on the job's own nodes
    train_nodes: int  # the job's own training nodes
    grants: list[Grant] = field(default_factory=list)
    seen: list[tuple[int, Relocation | None]] = field(default_factory=list)  # (after iteration, directive)
    acks: list[tuple[int, Relocation, str]] = field(default_factory=list)  # (after iteration, answer, note)
    error: BaseException | None = None
    deaf: bool = False  # never acknowledges a directive (a trainer without the relocation hook)


class SecondHalfFirst:
    """Orders a merge's acknowledgements: `opener` (the job that opens the merged group) waits at its
    boundary until the other job has acknowledged and been told to wait; the other acknowledges again
    only once `opener` has switched (it runs an iteration in its old group meanwhile)."""

    def __init__(self, opener: str) -> None:
        self.opener = opener
        self.waited = threading.Event()  # the other job's early acknowledgement was answered "wait"
        self.opened = threading.Event()  # the opener switched

    def before_ack(self, name: str) -> None:
        if name == self.opener:
            assert self.waited.wait(30), "the second half never acknowledged"
        elif self.waited.is_set():
            assert self.opened.wait(30), "the opener never switched"

    def after_ack(self, name: str, answer: Relocation) -> None:
        if answer.state is RelocationState.SWITCHED and name == self.opener:
            self.opened.set()
        elif answer.state is RelocationState.PENDING and name != self.opener:
            self.waited.set()


def run_job(run: JobRun, learned: threading.Barrier, order: SecondHalfFirst | None = None) -> None:
    """The job loop: Rollout, Train, Sync of each iteration in turn; at each boundary (after the Sync,
    before the next Rollout) acknowledge a pending directive (in `order` where given). Both jobs release
    the Sync that makes their times learned together, so that both learning events are queued at once."""
    job = run.job
    try:
        for it in range(ITERATIONS):
            for phase in PHASES:
                permit = job.acquire(phase, it, timeout_s=30)  # refused unless it is the job's next phase
                start = time.time()
                # a Train pooled over more training nodes than the job's own runs that much faster
                time.sleep(run.phase_s[phase] * (run.train_nodes / len(permit.nodes) if phase is Phase.TRAIN else 1))
                end = time.time()
                run.grants.append(Grant(job=job.name, phase=permit.phase, iteration=permit.iteration,
                                        nodes=permit.nodes, start_s=start, end_s=end))
                if phase is Phase.SYNC and it == LEARNED_AFTER - 1:
                    learned.wait(30)
                job.release(permit, end - start)
            directive = job.status().relocation
            run.seen.append((it, directive))
            if directive is not None and directive.state is RelocationState.PENDING and not run.deaf:
                if order is not None:
                    order.before_ack(job.name)
                run.acks.append((it, *job.ack_relocation(directive.epoch)))
                if order is not None:
                    order.after_ack(job.name, run.acks[-1][1])
    except BaseException as exc:  # reported by the test
        run.error = exc


def run_merge(make_coordinator: Callable[..., Any], scenario: Scenario,  # noqa: F811
              order: SecondHalfFirst | None = None,
              deaf: str = "") -> tuple[CoordinatorClient, dict[str, JobRun], dict[str, JobInfo]]:
    """Start the coordinator and the fleet, register the jobs and run both job loops to the end.

    Returns:
        The client, each job's run, and each job's status before it ran.
    """
    coord = make_coordinator(*scenario.flags)
    client = CoordinatorClient(coord.address, retry_s=30.0)
    add_node_streams(client, *scenario.fleet)
    runs = {s.name: JobRun(client.register_job(s), phase_s=scenario.phase_s[s.name], train_nodes=s.n_train_gpus // 8,
                           deaf=s.name == deaf)
            for s in scenario.specs}
    before = {n: r.job.status() for n, r in runs.items()}
    assert {n: s.group_id for n, s in before.items()} == {s.name: f"g{i}" for i, s in enumerate(scenario.specs)}
    learned = threading.Barrier(len(runs))
    threads = [threading.Thread(target=run_job, args=(r, learned, order), daemon=True) for r in runs.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name, r in runs.items():
        assert r.error is None and not any(t.is_alive() for t in threads), (name, r.error)
    return client, runs, before


def check_merge(client: CoordinatorClient, runs: dict[str, JobRun], before: dict[str, JobInfo],
                scenario: Scenario) -> dict[str, tuple[int, Relocation]]:
    """The invariants of a live merge; returns each job's (iteration after which it switched, directive)."""
    # Each job ran every phase of every iteration once, in on-policy order (the coordinator granted
    # exactly the phase asked for), and goes on from there.
    assert_on_policy_order(runs)
    for r in runs.values():
        info = r.job.status()
        assert (info.next_phase, info.next_iteration) == (Phase.ROLLOUT, ITERATIONS)

    # No directive before the times were learned; then one merge: two directives, one epoch,
    # each SWITCHED on its own job's acknowledgement, into the same new group.
    switched = {}
    for name, r in runs.items():
        assert all(d is None for it, d in r.seen if it < LEARNED_AFTER - 1), (name, r.seen)
        assert all(d.state is not RelocationState.CANCELLED for _, d, _ in r.acks), (name, r.acks)
        done = [(it, d) for it, d, _ in r.acks if d.state is RelocationState.SWITCHED]
        assert len(done) == 1, (name, "no merge switched" if not done else "switched twice", r.seen, r.acks)
        switched[name] = done[0]
    (_, a), (_, b) = switched.values()
    assert a.epoch == b.epoch and scenario.reason in a.reason, a.reason
    assert min(a.switched_epoch, b.switched_epoch) > a.epoch and a.switched_epoch != b.switched_epoch  # two switches
    assert (a.from_group, b.from_group) == ("g0", "g1") and a.to_group == b.to_group not in ("g0", "g1")
    assert {n: r.job.status().relocation for n, r in runs.items()} == {n: d for n, (_, d) in switched.items()}
    merged = a.to_group
    final = groups(client)
    assert set(final) == {merged} and sorted(final[merged]) == sorted(runs)  # one group fewer: both in one

    # Each job ran on its old nodes up to its switch and on the merged group's nodes after it.
    for name, (at, d) in switched.items():
        old = {*before[name].rollout_nodes, *before[name].train_nodes}
        new = {*d.rollout_nodes, *d.train_nodes}
        assert all(set(g.nodes) <= old for g in runs[name].grants if g.iteration <= at), name
        assert all(set(g.nodes) <= new for g in runs[name].grants if g.iteration > at), name
    assert a.rollout_nodes == b.rollout_nodes and a.train_nodes == b.train_nodes
    assert (len(a.rollout_nodes), len(a.train_nodes)) == scenario.merged

    # The nodes the merge does not use are free again (no group, no holder).
    nodes = {n.node_id: n for n in client.cluster_state().nodes}
    kept = {*a.rollout_nodes, *a.train_nodes}
    assert {n for n, v in nodes.items() if v.group_id == merged} == kept
    for n in nodes.keys() - kept:
        assert nodes[n].group_id == "" and nodes[n].holder is None, n

    assert_no_node_shared(runs)
    return switched


def assert_on_policy_order(runs: dict[str, JobRun]) -> None:
    """Each job ran every phase of every iteration once, in on-policy order."""
    for name, r in runs.items():
        assert [(g.phase, g.iteration) for g in r.grants] == [(ph, it) for it in range(ITERATIONS) for ph in PHASES], name


def assert_no_node_shared(runs: dict[str, JobRun]) -> None:
    """At no time did two jobs hold one node."""
    leases = [(g.job, n, g.start_s, g.end_s) for r in runs.values() for g in r.grants for n in g.nodes]
    for i, (j1, n1, s1, e1) in enumerate(leases):
        for j2, n2, s2, e2 in leases[i + 1:]:
            assert not (n1 == n2 and j1 != j2 and s1 < e2 and s2 < e1), (j1, j2, n1)


@pytest.mark.parametrize("scenario", [pool_merge(1), pool_merge(10), pair_merge()],
                         ids=["pool-learned-near-planned", "pool-learned-a-tenth-of-planned", "pair"])
def test_a_merge_directed_by_the_live_planner_switches_both_jobs_into_one_group(
        make_coordinator, scenario: Scenario) -> None:  # noqa: F811
    client, runs, before = run_merge(make_coordinator, scenario)
    check_merge(client, runs, before, scenario)
    client.close()


def test_the_second_half_of_a_live_merge_told_to_wait_joins_at_its_next_boundary(make_coordinator) -> None:  # noqa: F811
    scenario = uneven_pool_merge()
    client, runs, before = run_merge(make_coordinator, scenario, SecondHalfFirst(opener="A"))
    switched = check_merge(client, runs, before, scenario)
    (a_at, a), (b_at, b) = switched["A"], switched["B"]
    assert a.switched_epoch < b.switched_epoch  # A opened the merged group, B joined it

    # B acknowledged before A: told to wait (the directive still PENDING, no group yet), it ran one
    # more iteration in its old group, on its old nodes (check_merge), and switched at the boundary after.
    (early_at, early, note), (late_at, late, _) = runs["B"].acks
    assert early.state is RelocationState.PENDING and early.epoch == a.epoch and "waiting for A" in note, note
    assert early.to_group == "" and late.state is RelocationState.SWITCHED and late_at == b_at == early_at + 1
    assert [it for it, d in runs["B"].seen if d is not None and d.state is RelocationState.PENDING] == [early_at, b_at]
    assert [it for it, _, _ in runs["A"].acks] == [a_at] and a_at >= early_at  # A's one acknowledgement switched
    client.close()


def test_a_merge_whose_second_half_never_acknowledges_expires_and_leaves_both_jobs_valid(make_coordinator) -> None:  # noqa: F811
    # B runs without the relocation hook: A opens the merged group at its boundary, B's directive
    # expires at its deadline, B keeps its group and nodes, and nothing is lost or shared on the way.
    scenario = replace(pool_merge(1), flags=("--relocation-deadline", "1.5"))
    client, runs, before = run_merge(make_coordinator, scenario, deaf="B")
    deadline = time.monotonic() + 15
    while (d := runs["B"].job.status().relocation) is None or d.state is RelocationState.PENDING:
        assert time.monotonic() < deadline, f"B's directive did not expire: {d}"
        time.sleep(0.1)
    assert d.state is RelocationState.EXPIRED and runs["B"].acks == []
    assert_on_policy_order(runs)

    # A switched into the merged group of the same merge (the directives share one epoch); B never moved.
    opened = next(a for _, a, _ in runs["A"].acks if a.state is RelocationState.SWITCHED)
    assert opened.epoch == d.epoch and opened.from_group == "g0" and d.from_group == "g1"
    b_nodes = {*before["B"].rollout_nodes, *before["B"].train_nodes}
    assert all(set(g.nodes) <= b_nodes for g in runs["B"].grants)
    final = groups(client)
    assert final.get("g1") == ["B"] and all("B" not in m for g, m in final.items() if g != "g1"), final
    assert any(m == ["A"] for m in final.values()), final  # A alone, in a group of its own

    assert_no_node_shared(runs)
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
        add_jobs(rt, "AB", t_roll_s=0.2 * planned_x, t_train_s=0.6 * planned_x, slo=1.3, elastic=True)
        for _ in range(LEARNED_AFTER):
            for name in "AB":
                to_boundary(rt, name, tuple(PHASE_S.values()))  # type: ignore[arg-type]
        rec = rt.plan_deferred()
        assert rec is not None and "pool their training nodes" in rec.reason, planned_x
        reasons[planned_x] = rec.reason
    assert len(set(reasons.values())) == 1, reasons  # the same saving whatever the planned times
