"""Deployment modes, regrouping and learned times: properties of the policy with every mechanism on."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.coordinator.policy import ClusterState, PolicyConfig, RollMuxPolicy
from rollmux.coordinator.policy.api import RejectReason
from rollmux.coordinator.policy.intra_group import cycle_time, simulate_round_robin
from rollmux.coordinator.policy.learning import PhaseLearner
from rollmux.coordinator.policy.modes import colocated_solo_s
from rollmux.coordinator.policy.placement import new_group_options
from rollmux.coordinator.policy.regroup import apply_moves, place_batch, plan_moves, relocation_s, work_rate
from rollmux.core.model import ClusterSpec, Deployment, JobSpec, Phase, Pool
from rollmux.testing.builders import make_job

from .test_intra_group import groups

NODE_T = 8 * 5.28


def test_a_train_heavy_job_alone_goes_colocated_on_its_training_gpus_and_says_why() -> None:
    d = RollMuxPolicy().place(make_job("a", roll=30, train=150, slo=1.2), ClusterState())
    assert d.deployment is Deployment.COLOCATED_TRAIN and d.train_pool is Pool.TRAIN
    assert d.delta_usd_per_h == pytest.approx(NODE_T) and d.new_rollout_nodes == 0
    assert "colocated-train" in d.reason and "disaggregated alone $57.04/h" in d.reason


def test_a_tight_slo_keeps_the_job_disaggregated() -> None:
    d = RollMuxPolicy().place(make_job("a", roll=300, train=100, slo=1.05), ClusterState())
    assert d.deployment is Deployment.DISAGGREGATED
    assert any("colocated-train alone" in r.message for r in d.rejections)


def test_a_very_rollout_heavy_job_with_slack_runs_on_rollout_gpus_alone() -> None:
    # Training at H20 speed is 6.7x slower; a rollout 20x its training and SLO 2 absorb that.
    job = make_job("a", roll=600, train=30, slo=2.0)
    d = RollMuxPolicy().place(job, ClusterState())
    assert d.deployment is Deployment.COLOCATED_ROLLOUT and d.delta_usd_per_h == pytest.approx(8 * 1.85)
    state = ClusterState()
    group = state.apply(job, d)
    assert group.train_pool is Pool.ROLLOUT and state.gpus_in_use(Pool.TRAIN) == 0


def test_a_fixed_mode_is_a_constraint() -> None:
    job = JobSpec(name="a", n_rollout_gpus=8, n_train_gpus=8, slo=1.2, t_roll_s=30, t_train_s=150,
                  rollout_state_bytes=10**11, train_state_bytes=10**11, deployment="disaggregated")
    assert job.deployment is Deployment.DISAGGREGATED
    assert RollMuxPolicy().place(job, ClusterState()).deployment is Deployment.DISAGGREGATED
    with pytest.raises(Exception, match="deployment"):
        JobSpec(name="b", n_rollout_gpus=8, n_train_gpus=8, deployment="sideways")


def test_a_colocated_member_time_shares_a_groups_idle_training_pool_at_no_cost() -> None:
    state = ClusterState()
    policy = RollMuxPolicy(PolicyConfig(regroup=False))
    # Its training pool idles most of the cycle.
    heavy = replace(make_job("r", roll=400, train=40, slo=1.5), deployment=Deployment.DISAGGREGATED)
    state.apply(heavy, policy.place(heavy, state))
    small = make_job("s", roll=100, train=150, slo=2.0, n_r=16)  # needs two rollout nodes, the group has one
    d = policy.place(small, state)
    assert d.group_id is not None and d.delta_usd_per_h == 0.0 and d.deployment is Deployment.COLOCATED_TRAIN
    group = state.apply(small, d)
    assert group.members["s"].rollout_nodes == () and group.train_load_s > 40 + 150 + 100


jobs_st = st.lists(st.tuples(st.floats(20, 400), st.floats(20, 400), st.floats(1.0, 2.0), st.sampled_from([8, 16])),
                   min_size=1, max_size=9)


def _specs(raw: list[tuple[float, float, float, int]]) -> list[JobSpec]:
    return [make_job(f"j{i}", roll=r, train=t, slo=s, n_r=g, n_t=g) for i, (r, t, s, g) in enumerate(raw)]


def _colocated_alone_usd(job: JobSpec, cluster: ClusterSpec) -> float | None:
    """veRL's co-location of the job alone on its N_T training GPUs, if it meets the SLO."""
    gpus = cluster.nodes_for(job.n_train_gpus) * cluster.gpus_per_node
    if colocated_solo_s(job, cluster, Pool.TRAIN, gpus) > job.slo * job.t_solo_s * (1 + 1e-9):
        return None
    return cluster.nodes_for(job.n_train_gpus) * cluster.node_usd_per_h(Pool.TRAIN)


@settings(max_examples=60, deadline=None)
@given(jobs_st)
def test_a_placement_never_costs_more_than_colocating_the_job_alone(raw) -> None:  # noqa: ANN001
    state, policy = ClusterState(), RollMuxPolicy()
    for job in _specs(raw):
        d = policy.place(job, state)
        alone = _colocated_alone_usd(job, state.cluster)
        if alone is not None:
            assert d.delta_usd_per_h <= alone + 1e-9, d.explain()
        assert d.delta_usd_per_h <= min(o.usd_per_h for o in new_group_options(job, state.cluster, tuple(Deployment))
                                        if o.deployment is Deployment.DISAGGREGATED) + 1e-9
        state.apply(job, d)
        plan = plan_moves(state, policy, [job.name], lambda _: 1e9)
        before = state.usd_per_h
        # $ for one iteration of each moved job where it is (a lone job's group runs at its own period).
        round_usd = sum(state.groups[m.from_group].usd_per_h * cycle_time(state.groups[m.from_group].timings())
                        for m in plan)
        apply_moves(state, plan)
        if plan and "pool their training nodes" in plan[0].reason:
            # A pool merge buys throughput: more $/h, less $ for the same iterations (jobs end sooner).
            pooled = state.groups[state.job_group[plan[0].job]]
            assert pooled.usd_per_h * cycle_time(pooled.timings()) < round_usd - 1e-9
        else:
            assert state.usd_per_h <= before + 1e-9  # any other move is only taken when it saves $/h
        for g in state.groups.values():
            g.check_invariants()


@settings(max_examples=40, deadline=None)
@given(jobs_st)
def test_regrouped_schedules_keep_mutual_exclusion_on_policy_order_and_one_group_per_node(raw) -> None:  # noqa: ANN001
    state, policy = ClusterState(), RollMuxPolicy()
    place_batch(_specs(raw), state, policy)
    owner: dict[str, str] = {}
    for g in state.groups.values():
        for n in (*g.rollout, *g.train_nodes):
            assert owner.setdefault(n, g.group_id) == g.group_id, f"node {n} held by two groups"
        assert set(state.job_group[j] for j in g.members) == {g.group_id}
        res = simulate_round_robin(g.timings(), iterations=6, record=True)
        spans: dict[object, list[tuple[float, float]]] = {}
        last_end: dict[str, float] = {}
        for iv in sorted(res.intervals, key=lambda i: (i.start_s, i.phase is Phase.TRAIN)):
            for n in iv.nodes:  # a co-located Rollout holds its training nodes like a Train
                spans.setdefault(n, []).append((iv.start_s, iv.end_s))
            assert iv.start_s >= last_end.get(iv.job, 0.0) - 1e-9  # Rollout(i) -> Train(i) -> Rollout(i+1)
            last_end[iv.job] = iv.end_s
        for ivs in spans.values():
            ivs.sort()
            assert all(b[0] >= a[1] - 1e-9 for a, b in zip(ivs, ivs[1:]))
        colocated = [m for m in g.members.values() if m.colocated]
        assert all(not m.rollout_nodes for m in colocated)
        if colocated:
            assert any(iv.nodes == m.train_nodes and iv.phase is Phase.ROLLOUT and iv.job == m.spec.name
                       for m in colocated for iv in res.intervals)


def test_two_lone_jobs_are_merged_into_one_group_when_that_pays() -> None:
    state, policy = ClusterState(), RollMuxPolicy()
    a, b = make_job("a", roll=300, train=100), make_job("b", roll=100, train=300)
    _, moves = place_batch([a, b], state, policy)
    assert {m.job for m in moves} == {"a", "b"}
    (group,) = state.groups.values()
    assert set(group.members) == {"a", "b"} and state.usd_per_h == pytest.approx(8 * 1.85 + NODE_T)
    specs = {"a": a, "b": b}
    assert all(m.downtime_s == pytest.approx(relocation_s(specs[m.job], policy.config)) for m in moves)


def _lone_train_heavy_pair(config: PolicyConfig) -> tuple[ClusterState, RollMuxPolicy]:
    state, policy = ClusterState(), RollMuxPolicy(config)
    for name in ("a", "b"):  # too train-heavy to share one training node within SLO 1.5
        job = replace(make_job(name, roll=40, train=160, slo=1.5), elastic=True)  # pooling needs elastic Trains
        decision = policy.place(job, state)
        assert decision.deployment is Deployment.COLOCATED_TRAIN and decision.group_id is None
        state.apply(job, decision)
    return state, policy


def test_two_lone_train_heavy_jobs_pool_their_training_nodes_when_that_pays() -> None:
    state, policy = _lone_train_heavy_pair(PolicyConfig(work_aware=True))
    before = {gid: (g.usd_per_h, work_rate(g)) for gid, g in state.groups.items()}
    moves = plan_moves(state, policy, ["b"], lambda _: 1e7)
    assert {m.job for m in moves} == {"a", "b"} and "pool their training nodes" in moves[0].reason
    apply_moves(state, moves)
    (group,) = state.groups.values()
    assert len(group.train_nodes) == 2 and len(group.rollout) == 1  # both H800 nodes kept, one H20 node added
    assert all(m.deployment is Deployment.DISAGGREGATED for m in group.members.values())
    # Each Train stretches over both nodes: the period beats each job's lone co-located iteration.
    usd_before, rate_before = (sum(v[k] for v in before.values()) for k in (0, 1))
    assert state.usd_per_h > usd_before and state.usd_per_h / work_rate(group) < 0.95 * usd_before / rate_before
    # With the work-aware check on, the pooled group is a candidate for newcomers (pooled joins; here
    # c's SLO rules it out); with pooled joins off, or without the check, it takes no newcomer at all.
    c = make_job("c", roll=40, train=40, slo=2.0)
    d = policy.place(c, state)
    assert d.group_id is None
    assert any(r.group_id == group.group_id and r.reason is RejectReason.SLO for r in d.rejections), d.explain()
    strict = RollMuxPolicy(replace(policy.config, pooled_joins=False)).place(c, state)
    assert any(r.group_id == group.group_id and r.reason is RejectReason.TRAIN_POOL for r in strict.rejections)
    # Switched off, or with too little run left to pay for two restarts, nothing moves.
    off, off_policy = _lone_train_heavy_pair(PolicyConfig(pool_merge=False))
    assert plan_moves(off, off_policy, ["b"], lambda _: 1e7) == []
    short, short_policy = _lone_train_heavy_pair(PolicyConfig())
    assert plan_moves(short, short_policy, ["b"], lambda _: 3600.0) == []


def test_a_newcomer_keeps_a_co_execution_margin_below_its_budget() -> None:
    a = make_job("a", roll=100, train=100, slo=2.0)
    b = make_job("b", roll=100, train=100, slo=1.0)  # period with a: 200 = exactly b's budget
    for margin, joins in ((0.0, True), (0.02, False)):
        policy = RollMuxPolicy(PolicyConfig(modes=False, regroup=False, coexec_margin=margin))
        state = ClusterState()
        state.apply(a, policy.place(a, state))
        assert (policy.place(b, state).group_id is not None) is joins


def test_a_move_that_cannot_pay_back_its_downtime_is_not_taken() -> None:
    state, policy = ClusterState(), RollMuxPolicy()
    a, b = make_job("a", roll=300, train=100), make_job("b", roll=100, train=300)
    for j in (a, b):
        state.apply(j, policy.place(j, state))
    assert plan_moves(state, policy, ["b"], lambda _: 60.0) == []  # one minute left: not worth a restart
    assert plan_moves(state, RollMuxPolicy(PolicyConfig(regroup=False)), ["b"], lambda _: 1e9) == []


def test_learned_profile_is_a_high_percentile_once_enough_iterations_are_seen() -> None:
    config = PolicyConfig(learn_min_samples=5, learn_window=20, learn_quantile=0.9)
    learner = PhaseLearner(config)
    job = make_job("a", roll=100, train=100)
    learner.register(job)
    for k in range(4):
        learner.observe("a", 90.0 + k, 60.0)
    assert learner.profile(job) is None  # not confident yet
    learner.observe("a", 99.0, 70.0)
    p = learner.profile(job)
    assert p is not None and p.learned
    assert 95.0 < p.t_roll_s <= 99.0 and 60.0 < p.t_train_s <= 70.0
    assert p.t_solo_s == pytest.approx((90 + 91 + 92 + 93 + 99 + 4 * 60 + 70) / 5)
    with pytest.raises(Exception, match="invalid"):
        learner.observe("a", -1.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(groups(), st.lists(st.booleans(), min_size=8, max_size=8), st.integers(1, 5), st.booleans())
def test_co_located_members_run_through_the_grant_step_as_the_slo_check_assumes(members, colocate, iterations,  # noqa: ANN001
                                                                               migrate) -> None:
    from dataclasses import replace as dc_replace

    from rollmux.coordinator.policy.executor import run_schedule
    from rollmux.coordinator.policy.intra_group import cycle_time, simulate_round_robin

    mixed = [dc_replace(m, rollout_nodes=(), rollout_on_train=True) if c else m for m, c in zip(members, colocate)]
    hook = (lambda idx, it: 0.5 * mixed[idx].t_roll_s) if migrate else None
    model = simulate_round_robin(mixed, iterations=iterations, record=True, rollout_release=hook)
    run = run_schedule(mixed, iterations=iterations, record=True, rollout_release=hook)
    key = lambda r: sorted((i.job, i.phase.value, i.iteration, round(i.start_s, 6), round(i.end_s, 6))  # noqa: E731
                           for i in r.intervals)
    assert key(run) == key(model)
    if not migrate:  # the exact period the SLO check uses is the steady state of that schedule
        long = simulate_round_robin(mixed, iterations=60)
        # 200 iterations: a transient can outlast 40 (a shared rollout node, four members: 1019.65 s vs 1020 s)
        starts = sorted(i.start_s for i in simulate_round_robin(mixed, iterations=200, record=True).intervals
                        if i.job == mixed[0].name and i.phase is Phase.ROLLOUT)
        assert (starts[-1] - starts[-21]) / 20 == pytest.approx(cycle_time(mixed), rel=1e-6)
        assert long.makespan_s > 0


def _said_slowdowns(text: str) -> list[tuple[float, str, float]]:
    import re

    return [(float(a), op, float(b)) for a, op, b in re.findall(r"planned slowdown ([\d.]+) (<=|>) SLO ([\d.]+)", text)]


@pytest.mark.parametrize(("mode", "slo"), [("colocated-train", 1.0), (None, 1.0), (None, 1.2)],
                         ids=["fixed-colocated-too-slow", "any-mode-slo-1", "any-mode-slo-1.2"])
def test_the_explanation_of_a_new_group_is_true(mode: str | None, slo: float) -> None:
    """What `explain()` says of a lone placement holds: the comparison it prints is true, and the option it
    placed the job in is not also among its rejections."""
    job = JobSpec(name="a", n_rollout_gpus=8, n_train_gpus=8, slo=slo, t_roll_s=30, t_train_s=150,
                  rollout_state_bytes=10**11, train_state_bytes=10**11, deployment=mode)
    d = RollMuxPolicy().place(job, ClusterState())
    said = _said_slowdowns(d.reason)
    assert said, d.explain()
    for a, op, b in said:
        assert (a <= b) if op == "<=" else (a > b), d.explain()
    chosen = f"{d.deployment.value} alone on"
    assert not any(r.group_id == "new" and r.message.startswith(chosen) for r in d.rejections), d.explain()
