"""Multi-move regrouping (`policy.replan`), its all-or-nothing switch (`policy.switch`), and the
one-pass arrival (`regroup.place_arrival`) against the two-pass one it replaces."""

from __future__ import annotations

import copy
import random

import pytest

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.intra_group import member_periods
from rollmux.coordinator.policy.optimum import optimal_partition
from rollmux.coordinator.policy.placement import BIG_GROUP
from rollmux.coordinator.policy.profiler import state_bytes_per_node
from rollmux.coordinator.policy.regroup import apply_moves, place_arrival, plan_moves
from rollmux.coordinator.policy.replan import apply_plan, plan_regroup
from rollmux.coordinator.policy.switch import PlanSwitch, RollbackReason, SwitchError, SwitchPhase
from rollmux.coordinator.sim.workload import PROFILES, SIZES
from rollmux.core.model import JobSpec

LIVE = PolicyConfig(work_aware=True, best_move=True, merge_candidates=16)
LONG_S = 1e7  # remaining run: every move has time to pay


def _jobs(n: int, seed: int, prefix: str = "j") -> list[JobSpec]:
    """Seeded jobs of the mixed Table 6 workload (the simulator's phase ranges and sizes), SLO ~ U(1, 2)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        profile = rng.choice(list(PROFILES))
        k = rng.randrange(len(SIZES))
        (r_lo, r_hi), (t_lo, t_hi) = PROFILES[profile][k]
        roll_b, train_b = state_bytes_per_node(float(SIZES[k].model.rstrip("B")))
        out.append(JobSpec(name=f"{prefix}{i}", n_rollout_gpus=SIZES[k].gpus, n_train_gpus=SIZES[k].gpus,
                           slo=rng.uniform(1.0, 2.0), t_roll_s=rng.uniform(r_lo, r_hi), t_train_s=rng.uniform(t_lo, t_hi),
                           rollout_state_bytes=roll_b, train_state_bytes=train_b))
    return out


def _one_by_one(jobs: list[JobSpec], config: PolicyConfig = LIVE) -> tuple[ClusterState, RollMuxPolicy]:
    state, policy = ClusterState(), RollMuxPolicy(config)
    for j in jobs:
        state.apply(j, policy.place(j, state))
    return state, policy


def _key(d) -> tuple:  # noqa: ANN001
    return (d.job, d.strategy, d.group_id, d.rollout_nodes, d.new_rollout_nodes, d.new_train_nodes,
            round(d.delta_usd_per_h, 9), d.deployment, d.train_pool, tuple(sorted(d.t_coexec_s.items())))


def _where(state: ClusterState) -> dict[str, tuple]:
    return {g.group_id: (g.jobs, g.rollout_nodes, g.train_nodes, g.placements) for g in state.snapshot()}


def _safe(state: ClusterState, config: PolicyConfig) -> None:
    """Every group keeps each member within its SLO budget (with the join margins) and its DRAM bounds."""
    for g in state.groups.values():
        g.check_invariants()
        if len(g.members) < 2:
            continue
        periods = member_periods(g.timings())
        margin = 1 + (config.coexec_margin_big if len(g.members) >= BIG_GROUP else config.coexec_margin)
        for n, m in g.members.items():
            assert periods[n] <= m.budget_s / margin * (1 + 1e-6), (g.group_id, n, periods[n], m.budget_s)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_pass_arrival_decides_as_placement_then_plan(seed: int) -> None:
    """Same decisions and plans as `place` followed by `plan_moves` on seeded traces with departures."""
    fleet = _jobs(40, seed)
    a, policy_a = _one_by_one(fleet)
    b, policy_b = copy.deepcopy(a), RollMuxPolicy(LIVE)
    rng = random.Random(seed)
    alive = [j.name for j in fleet]
    for job in _jobs(25, seed + 100, prefix="p"):
        d_a = policy_a.place(job, a)
        a.apply(job, d_a)
        m_a = plan_moves(a, policy_a, [job.name], lambda _: 36_000.0, pull=False)
        d_b, _, m_b = place_arrival(b, policy_b, job, lambda _: 36_000.0)
        assert _key(d_a) == _key(d_b)
        assert [(m.job, m.from_group, _key(m.decision)) for m in m_a] == [(m.job, m.from_group, _key(m.decision)) for m in m_b]
        apply_moves(a, m_a)
        apply_moves(b, m_b)
        gone = alive.pop(rng.randrange(len(alive)))
        a.remove_job(gone)
        b.remove_job(gone)
        alive.append(job.name)
    assert _where(a) == _where(b)


_PLANNED: list[tuple[ClusterState, RollMuxPolicy, object]] = []


def _planned() -> tuple[ClusterState, RollMuxPolicy, object]:
    """Eight jobs placed one at a time, single moves and merges taken until none pays, then the
    multi-move plan (computed once per module; each caller gets its own copy)."""
    if not _PLANNED:
        _PLANNED.append(_plan_once())
    return copy.deepcopy(_PLANNED[0])


def _plan_once() -> tuple[ClusterState, RollMuxPolicy, object]:
    state, policy = _one_by_one(_jobs(8, 1))
    while step := next((m for n in list(state.job_group) if (m := plan_moves(state, policy, [n], lambda _: LONG_S))), None):
        apply_moves(state, step)
    plan = plan_regroup(state, policy, list(state.groups), lambda _: LONG_S)
    return state, policy, plan


def test_a_multi_move_plan_reaches_the_optimum_where_single_moves_stop() -> None:
    state, policy, plan = _planned()
    assert plan is not None and len(plan.moves) >= 2
    before = state.usd_per_h
    jobs = [m.spec for m in state.members()]
    opt = optimal_partition(jobs, state.cluster, policy.config, margins=True).usd_per_h
    assert before > opt + 1
    apply_plan(state, plan)
    assert state.usd_per_h == pytest.approx(opt)
    assert state.usd_per_h == pytest.approx(before - (plan.usd_before - plan.usd_after))
    _safe(state, policy.config)


def test_no_plan_when_the_moves_cannot_pay_for_their_downtime() -> None:
    state, policy, _ = _planned()
    assert plan_regroup(state, policy, list(state.groups), lambda _: 60.0) is None
    assert plan_regroup(state, policy, list(state.groups), lambda _: 0.0) is None


@pytest.mark.parametrize("seed", [0, 2])
def test_every_plan_keeps_slo_and_dram_bounds_and_lowers_cost(seed: int) -> None:
    state, policy = _one_by_one(_jobs(8, seed))
    plan = plan_regroup(state, policy, list(state.groups), lambda _: LONG_S)
    if plan is None:
        return
    before = state.usd_per_h
    apply_plan(state, plan)
    assert state.usd_per_h < before
    assert sorted(state.job_group) == sorted(j.name for j in _jobs(8, seed))
    _safe(state, policy.config)


def test_the_switch_commits_only_when_every_moved_job_acknowledged() -> None:
    state, _, plan = _planned()
    switch = PlanSwitch(plan=plan, epoch=7, deadline_s=100.0)
    for job in plan.jobs[:-1]:
        assert switch.ack(job, 7, now_s=10.0) is SwitchPhase.PENDING
    with pytest.raises(SwitchError):
        switch.commit(state)
    switch.ack(plan.jobs[-1], 7, now_s=20.0)
    assert switch.commit(state) is not None and switch.phase is SwitchPhase.COMMITTED
    assert state.usd_per_h == pytest.approx(plan.usd_after + (state.usd_per_h - plan.usd_after))


@pytest.mark.parametrize("how", ["decline", "deadline", "late-ack", "stale"])
def test_a_rolled_back_switch_leaves_every_job_where_it_was(how: str) -> None:
    state, _, plan = _planned()
    before = _where(state)
    switch = PlanSwitch(plan=plan, epoch=3, deadline_s=100.0)
    switch.ack(plan.jobs[0], 3, now_s=1.0)
    if how == "decline":
        switch.decline(plan.jobs[1], 3, why="leaving")
        assert switch.reason is RollbackReason.DECLINED
    elif how == "deadline":
        switch.expire(now_s=101.0)
        assert switch.reason is RollbackReason.DEADLINE
    elif how == "late-ack":
        switch.ack(plan.jobs[1], 3, now_s=150.0)
        assert switch.reason is RollbackReason.DEADLINE
    else:
        for job in plan.jobs[1:]:
            switch.ack(job, 3, now_s=2.0)
        state.remove_job(plan.jobs[-1])  # the cluster changed: a moved job left meanwhile
        before = _where(state)
        assert switch.commit(state) == []
        assert switch.reason is RollbackReason.STALE
    assert switch.phase is SwitchPhase.ROLLED_BACK
    assert _where(state) == before
    with pytest.raises(SwitchError):
        switch.ack(plan.jobs[0], 4, now_s=1.0)  # another epoch's acknowledgement
