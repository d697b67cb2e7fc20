"""The grant step: round-robin turns, Train keeping its turn for Sync, skipped jobs, joins and leaves;
and the event-by-event run through it equals the schedule the SLO check assumes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.coordinator.policy.api import PolicyError
from rollmux.coordinator.policy.executor import run_schedule
from rollmux.coordinator.policy.grants import (
    PhaseRequest,
    Ring,
    deadlock_edge,
    grant_step,
    served_after_leaving,
)
from rollmux.coordinator.policy.intra_group import MemberTiming, simulate_round_robin
from rollmux.core.model import Phase

from .test_intra_group import groups


def ask(job: str, *nodes: str, keeps_turn: bool = False) -> dict[str, PhaseRequest]:
    return {job: PhaseRequest(job=job, nodes=nodes, keeps_turn=keeps_turn)}


def test_only_the_job_whose_turn_it_is_gets_a_free_node() -> None:
    rings = {"t": Ring(order=("a", "b"), turn="a")}
    step = grant_step(rings, {}, ask("b", "t"), usable={"t"})
    assert step.grants == () and step.served == {}  # b is ready, but it is a's turn: no work stealing
    step = grant_step(rings, {}, {**ask("a", "t"), **ask("b", "t")}, usable={"t"})
    assert [g.job for g in step.grants] == ["a"] and step.served == {"t": "a"}
    assert Ring.following(("a", "b"), step.served["t"]).turn == "b"


def test_a_grant_needs_every_node_free_usable_and_its_turn() -> None:
    rings = {"r0": Ring(order=("a",), turn="a"), "r1": Ring(order=("b", "a"), turn="b")}
    assert grant_step(rings, {}, ask("a", "r0", "r1"), usable={"r0", "r1"}).grants == ()
    rings["r1"] = Ring(order=("b", "a"), turn="a")
    assert grant_step(rings, {"r1": "b"}, ask("a", "r0", "r1"), usable={"r0", "r1"}).grants == ()
    assert grant_step(rings, {}, ask("a", "r0", "r1"), usable={"r0"}).grants == ()
    assert [g.nodes for g in grant_step(rings, {}, ask("a", "r0", "r1"), usable={"r0", "r1"}).grants] == [("r0", "r1")]


def test_train_keeps_the_turn_for_its_sync() -> None:
    rings = {"t": Ring(order=("a", "b"), turn="a")}
    step = grant_step(rings, {}, ask("a", "t", keeps_turn=True), usable={"t"})
    assert [g.job for g in step.grants] == ["a"] and step.served == {}  # still a's turn: its Sync is next
    step = grant_step(rings, {}, {**ask("a", "t"), **ask("b", "t")}, usable={"t"})
    assert [g.job for g in step.grants] == ["a"]


def test_a_skipped_job_loses_its_turn_and_the_rotation_goes_on() -> None:
    rings = {"t": Ring(order=("a", "b", "c"), turn="a")}
    step = grant_step(rings, {}, ask("c", "t"), usable={"t"}, skip={"a", "b"})
    assert [g.job for g in step.grants] == ["c"] and step.served == {"t": "c"}
    step = grant_step(rings, {}, {}, usable={"t"}, skip={"a"})
    assert step.served == {"t": "a"}  # passed over: b's turn now, a waits for its next one
    assert grant_step(rings, {}, {}, usable={"t"}, skip={"a", "b", "c"}).served == {}


def test_joins_take_their_turn_at_the_end_of_the_meta_iteration_and_leavers_pass_theirs_on() -> None:
    assert Ring.following(("a", "b"), "a").turn == "b"  # b joined after a's turn: b goes before a again
    assert Ring.following(("a", "b"), None).turn == "a"
    ring = Ring(order=("a", "b", "c"), turn="b")
    assert Ring.following(("a", "c"), served_after_leaving(ring, "b")).turn == "c"
    assert Ring.following(("b", "c"), served_after_leaving(ring, "a")).turn == "b"
    assert served_after_leaving(Ring(order=("a",), turn="a"), "a") is None


def test_a_request_outside_its_ring_is_a_caller_bug() -> None:
    with pytest.raises(PolicyError, match="not in its round-robin ring"):
        grant_step({"t": Ring(order=("a",), turn="a")}, {}, ask("b", "t"), usable={"t"})
    with pytest.raises(PolicyError, match="not one of its jobs"):
        Ring(order=("a",), turn="z")


def test_a_cycle_of_turns_is_broken_where_the_turn_holder_waits_elsewhere() -> None:
    # The chaos run's state: x holds r's turn but waits for Train on t; t's turn is y's (it joined
    # after x's last Train), and y waits for its first Rollout on r. Neither turn would ever move.
    rings = {"r": Ring(order=("x", "y"), turn="x"), "t": Ring(order=("x", "y"), turn="y")}
    requests = {**ask("x", "t", keeps_turn=True), **ask("y", "r")}
    assert deadlock_edge(rings, {}, {}, requests, usable={"r", "t"}) == ("t", "y")  # y does not need t now
    step = grant_step(rings, {}, requests, usable={"r", "t"})
    assert [(g.job, g.nodes) for g in step.grants] == [("x", ("t",))]  # Train goes; its Sync keeps the turn
    assert step.served == {"t": "y"}  # y passed over on t, its turn comes round again after x
    rings["t"] = Ring.following(rings["t"].order, step.served["t"])
    assert rings["t"].turn == "x"


def test_waiting_on_a_held_or_unusable_node_or_a_running_job_is_not_a_deadlock() -> None:
    rings = {"r": Ring(order=("x", "y"), turn="x"), "t": Ring(order=("x", "y"), turn="y")}
    requests = {**ask("x", "t"), **ask("y", "r")}
    assert grant_step(rings, {"t": "z"}, requests, usable={"r", "t"}).grants == ()  # t frees by itself
    assert grant_step(rings, {}, requests, usable={"r"}).grants == ()  # t's sidecar comes back
    assert grant_step(rings, {}, ask("x", "t"), usable={"r", "t"}).grants == ()  # y runs elsewhere: strict turn


@st.composite
def turn_states(draw):  # type: ignore[no-untyped-def]
    jobs = [f"j{i}" for i in range(draw(st.integers(2, 4)))]
    nodes = [f"n{i}" for i in range(draw(st.integers(1, 4)))]
    rings = {}
    for n in nodes:
        order = tuple(j for j in jobs if draw(st.booleans())) or (jobs[0],)
        rings[n] = Ring(order=order, turn=draw(st.sampled_from(order)))
    requests = {}
    for j in jobs:
        mine = [n for n in nodes if j in rings[n].order]
        if mine and draw(st.booleans()):
            picked = tuple(n for n in mine if draw(st.booleans())) or (mine[0],)
            requests[j] = PhaseRequest(job=j, nodes=picked, keeps_turn=draw(st.booleans()))
    return rings, requests


@settings(max_examples=300, deadline=None)
@given(turn_states())
def test_after_a_step_no_waiting_cycle_remains_and_a_cluster_of_waiters_grants_something(state) -> None:  # type: ignore[no-untyped-def]
    rings, requests = state
    usable = set(rings)
    step = grant_step(rings, {}, requests, usable=usable)
    granted = {g.job for g in step.grants}
    after = {n: Ring.following(r.order, step.served[n]) if n in step.served else r for n, r in rings.items()}
    holders = {n: g.job for g in step.grants for n in g.nodes}
    waiting = {j: r for j, r in requests.items() if j not in granted}
    assert deadlock_edge(after, {}, holders, waiting, usable=usable) is None
    if requests and all(j in requests for r in rings.values() for j in r.order):
        assert step.grants  # every node free and usable and every job waiting: granting nothing is a stall
    taken = [n for g in step.grants for n in g.nodes]
    assert len(taken) == len(set(taken))  # one holder per node


def test_issue_example_long_job_trains_before_the_short_one_trains_again() -> None:
    # A 10+10 s and B 100+100 s on separate rollout nodes: the model puts B's Train(0) at 100-200 s,
    # and A's Train(1) only after it (strict round-robin on the training pool).
    res = run_schedule([MemberTiming(name="A", t_roll_s=10, t_train_s=10, rollout_nodes=("r0",)),
                        MemberTiming(name="B", t_roll_s=100, t_train_s=100, rollout_nodes=("r1",))],
                       iterations=3, record=True)
    trains = [(iv.job, iv.iteration, iv.start_s) for iv in res.intervals if iv.phase is Phase.TRAIN]
    assert trains[:3] == [("A", 0, 10.0), ("B", 0, 100.0), ("A", 1, 200.0)]


def key(res):  # type: ignore[no-untyped-def]
    return sorted((iv.job, iv.phase.value, iv.iteration, round(iv.start_s, 6), round(iv.end_s, 6),
                   None if iv.released_s is None else round(iv.released_s, 6)) for iv in res.intervals)


@settings(max_examples=200, deadline=None)
@given(groups(), st.integers(1, 6), st.booleans(), st.integers(0, 10**6))
def test_the_run_through_the_grant_step_is_the_schedule_the_slo_check_assumes(
        members: list[MemberTiming], iterations: int, migrate: bool, seed: int) -> None:
    def phase_time(idx: int, it: int, phase: Phase) -> float:
        m = members[idx]
        wobble = 1.0 + ((seed + 7 * idx + 3 * it) % 5) / 10
        return m.t_roll_s * wobble if phase is Phase.ROLLOUT else m.t_train_s / wobble

    def release(idx: int, it: int) -> float:
        return float((seed + 13 * idx + 5 * it) % 400)

    hook = release if migrate else None
    model = simulate_round_robin(members, iterations=iterations, phase_time=phase_time, record=True,
                                 rollout_release=hook)
    run = run_schedule(members, iterations=iterations, phase_time=phase_time, record=True, rollout_release=hook)
    assert key(run) == key(model)
    assert run.makespan_s == pytest.approx(model.makespan_s)
    assert run.periods_s == pytest.approx(model.periods_s)


def req(job: str, *nodes: str, ready: bool = True, since: float = 0.0) -> PhaseRequest:
    return PhaseRequest(job=job, nodes=nodes, ready=ready, since=since)


@pytest.mark.parametrize(("requests", "holders", "granted", "served"), [
    pytest.param([req("b", "t")], {}, [("b", ("t",))], {},
                 id="turn's job elsewhere: the node is lent, the turn stays"),
    pytest.param([req("a", "t", ready=False), req("b", "t")], {}, [("a", ("t",))], {"t": "a"},
                 id="turn's job requests the node: its turn, no loan"),
    pytest.param([req("b", "t", ready=False)], {}, [], {},
                 id="a request not asked for yet borrows nothing"),
    pytest.param([req("b", "t", since=2.0), req("c", "t", since=1.0)], {}, [("c", ("t",))], {},
                 id="longest-waiting borrower first"),
    pytest.param([req("b", "t")], {"t": "c"}, [], {}, id="a held node is not lent"),
    pytest.param([req("a", "t", "u"), req("b", "t")], {"u": "z"}, [], {},
                 id="a node where the turn's job waits (for another node too) is not lent"),
])
def test_lending_a_node_whose_turn_job_does_not_request_it(requests, holders, granted, served) -> None:  # noqa: ANN001
    rings = {"t": Ring(order=("a", "b", "c"), turn="a"), "u": Ring(order=("a", "z"), turn="a")}
    asks = {r.job: r for r in requests}
    step = grant_step(rings, holders, asks, usable={"t", "u"}, lend=True)
    assert [(g.job, g.nodes) for g in step.grants] == granted
    assert step.served == served
    strict = grant_step(rings, holders, asks, usable={"t", "u"})  # without lending: the turn alone
    assert all(g.job == "a" for g in strict.grants)


def test_a_loan_keeps_the_turn_so_the_turn_job_goes_next() -> None:
    rings = {"t": Ring(order=("a", "b"), turn="a")}
    lent = grant_step(rings, {}, {"b": req("b", "t")}, usable={"t"}, lend=True)
    assert [g.job for g in lent.grants] == ["b"] and lent.served == {}
    back = grant_step(rings, {}, {"a": req("a", "t", since=5.0), "b": req("b", "t", since=1.0)}, usable={"t"},
                      lend=True)
    assert [g.job for g in back.grants] == ["a"] and back.served == {"t": "a"}


def test_a_borrowed_train_keeps_its_nodes_for_its_sync_and_the_turn_stays() -> None:
    rings = {"t": Ring(order=("a", "b"), turn="a")}
    train = PhaseRequest(job="b", nodes=("t",), keeps_turn=True, since=1.0)
    assert [g.job for g in grant_step(rings, {}, {"b": train}, usable={"t"}, lend=True).grants] == ["b"]
    sync = PhaseRequest(job="b", nodes=("t",), continues=True, since=2.0)
    step = grant_step(rings, {}, {"a": req("a", "t", since=1.5), "b": sync}, usable={"t"}, lend=True)
    assert [g.job for g in step.grants] == ["b"] and step.served == {}  # a asked meanwhile: it goes next
