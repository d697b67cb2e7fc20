"""The chaos ledger's checks catch what they claim to: overlaps, lost, repeated and reordered phases."""

from __future__ import annotations

from typing import Any

from rollmux.testing.chaos.ledger import judge

ROLLOUT, TRAIN = ["r0"], ["t0"]


class Log:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 0.0

    def add(self, ev: str, run: str, pid: int = 1, **fields: Any) -> None:
        self.t += 1.0
        self.events.append({"t": self.t, "ev": ev, "run": run, "pid": pid, **fields})

    def phase(self, run: str, phase: str, it: int, epoch: int, *, released: bool = True, pid: int = 1) -> None:
        where = {"phase": phase, "it": it, "epoch": epoch, "nodes": ROLLOUT if phase == "rollout" else TRAIN}
        self.add("start", run, pid, **where)
        self.add("end", run, pid, **where)
        if released:
            self.add("released", run, pid, **where)

    def job(self, run: str, iterations: int, *, skip: tuple[str, int] | None = None, first_epoch: int = 1) -> None:
        epoch = first_epoch
        for it in range(iterations):
            for ph in ("rollout", "train", "sync"):
                self.phase(run, ph, it, epoch, released=(ph, it) != skip)
                epoch += 1


def test_a_clean_log_is_clean() -> None:
    log = Log()
    log.job("a", 2)
    v = judge(log.events, {"a": True}, iterations=2)
    assert v.clean and v.phases_completed == 6


def test_two_runs_on_one_node_at_once_is_a_violation() -> None:
    log = Log()
    log.add("start", "a", 1, phase="rollout", it=0, epoch=1, nodes=ROLLOUT)
    log.add("start", "b", 2, phase="rollout", it=0, epoch=2, nodes=ROLLOUT)
    log.add("end", "a", 1, phase="rollout", it=0, epoch=1, nodes=ROLLOUT)
    log.add("end", "b", 2, phase="rollout", it=0, epoch=2, nodes=ROLLOUT)
    v = judge(log.events, {}, iterations=1)
    assert len(v.violations) == 1 and "b (epoch 2)" in v.violations[0] and not v.clean


def test_a_killed_process_ends_its_phase_where_it_died() -> None:
    log = Log()
    log.add("start", "a", 1, phase="rollout", it=0, epoch=1, nodes=ROLLOUT)
    log.add("killed", "a", 1)
    log.add("start", "b", 2, phase="rollout", it=0, epoch=2, nodes=ROLLOUT)
    log.add("end", "b", 2, phase="rollout", it=0, epoch=2, nodes=ROLLOUT)
    v = judge(log.events, {}, iterations=1)
    assert not v.violations and v.unclosed == 0


def test_lost_repeated_and_reordered_phases_are_counted() -> None:
    log = Log()
    log.job("lost", 2, skip=("train", 0))
    log.job("rep", 1, first_epoch=100)
    log.phase("rep", "sync", 0, 200)  # released twice
    log.phase("ooo", "train", 0, 301)
    log.phase("ooo", "rollout", 0, 302)  # granted after its train: out of on-policy order
    log.phase("ooo", "sync", 0, 303)
    v = judge(log.events, {"lost": True, "rep": True, "ooo": True}, iterations=2)
    by = {r.run: r for r in v.runs}
    assert by["lost"].lost == (("train", 0),)
    assert by["rep"].repeated == (("sync", 0),)
    assert by["ooo"].out_of_order
    assert not v.clean


def test_an_aborted_run_may_stop_early_but_not_skip() -> None:
    log = Log()
    log.phase("a", "rollout", 0, 1)
    log.phase("a", "train", 0, 2)
    v = judge(log.events, {"a": False}, iterations=3)
    assert v.clean
    log.phase("b", "rollout", 0, 3)
    log.phase("b", "sync", 0, 4)  # train(0) missing before it
    assert judge(log.events, {"a": False, "b": False}, iterations=3).lost == 1


def test_a_kill_while_releasing_is_not_judged_lost_and_recovery_is_timed() -> None:
    log = Log()
    log.job("a", 1, skip=("train", 0))
    log.events.append({"t": 2.5, "ev": "fault", "kind": "rank_kill", "run": "a", "epoch": 2, "in_release": True,
                       "nodes": TRAIN, "ready_t": 2.5})
    v = judge(log.events, {"a": True}, iterations=1)
    assert v.lost == 0 and v.unconfirmed == 1
    assert v.faults["rank_kill"] == 1 and v.recovery_s["rank_kill"] == [4.0 - 2.5]  # the next start on t0


def test_a_failover_no_standby_took_over_is_unrecovered_however_soon_jobs_ran_again() -> None:
    log = Log()
    log.job("a", 2)
    log.events.append({"t": 2.5, "ev": "fault", "kind": "failover", "ready_t": 2.6, "failed": True})
    v = judge(log.events, {"a": True}, iterations=2)
    assert v.faults["failover"] == 1 and v.unrecovered["failover"] == 1 and "failover" not in v.recovery_s
