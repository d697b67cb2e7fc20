"""Relocation directives and learned phase times in the runtime, on a fake clock (no I/O).

Scenario: A and B cannot share a training node (their training state fills its host DRAM), so B
opens g1; C packs with A in g0. When A leaves, C alone holds g0: moving it to g1 frees g0's nodes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.policy.api import PolicyConfig
from rollmux.coordinator.policy.profiler import resolve
from rollmux.coordinator.service.runtime import Runtime, views
from rollmux.coordinator.service.runtime.api import PermitState, ServiceConfig
from rollmux.coordinator.service.runtime.state import live_policy_config
from rollmux.core.model import ClusterSpec, JobSpec, Phase, Pool, RelocationState
from rollmux.wire.errors import FailedPreconditionError

from .builders import FakeClock

TB = 10**12


def scenario(config: ServiceConfig | None = None, policy: RollMuxPolicy | None = None) -> tuple[Runtime, FakeClock]:
    clock = FakeClock()
    rt = Runtime(ClusterSpec(), config or ServiceConfig(), clock=clock, wall=clock, policy=policy)
    for i in range(2):
        rt.register_node(node_id=f"r{i}", pool=Pool.ROLLOUT, gpu_type="H20", gpu_count=8, host_dram_bytes=TB, nvml={})
        rt.register_node(node_id=f"t{i}", pool=Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=TB, nvml={})
    for n in list(rt.state.nodes):
        rt.node_connected(n)
    for name, train_state in (("A", 6 * 10**11), ("B", 6 * 10**11), ("C", 10**9)):
        spec = JobSpec(name=name, n_rollout_gpus=8, n_train_gpus=8, t_roll_s=10, t_train_s=10, slo=3.0,
                       rollout_state_bytes=10**9, train_state_bytes=train_state)
        rt.register_job(resolve(spec, ClusterSpec()), token_sha256="t", nonce_sha256="n" + name)
    assert [rt.state.jobs[n].group_id for n in "ABC"] == ["g0", "g1", "g0"]
    rt.take_changes()
    return rt, clock


def run_phase(rt: Runtime, name: str, duration_s: float = 1.0) -> None:
    p = rt.state.permits[name]
    got = rt.acquire(name, p.phase, p.iteration)
    assert got is not None and got.state is PermitState.GRANTED, views.wait_reason(rt, name)
    rt.release(name, got.epoch, duration_s)


def drive(rt: Runtime, names: list[str], done: object, steps: int = 200) -> list[tuple[str, Phase, int]]:
    """Run whichever job's phase is grantable (release it at once) until `done()`; returns the phases run."""
    ran: list[tuple[str, Phase, int]] = []
    for _ in range(steps):
        if done():  # type: ignore[operator]
            return ran
        for name in names:
            p = rt.state.permits[name]
            got = rt.acquire(name, p.phase, p.iteration)
            if got is not None and got.state is PermitState.GRANTED:
                ran.append((name, got.phase, got.iteration))
                rt.release(name, got.epoch, 1.0)
                rt.check_invariants()
    raise AssertionError(f"not done after {steps} steps: {ran[-6:]}")


def test_a_departure_directs_a_move_that_switches_at_the_iteration_boundary() -> None:
    rt, _ = scenario()
    rt.remove_job("A", reason="deregistered")
    rec = rt.directives.relocations["C"]
    assert (rec.from_group, rec.to_group, rec.state) == ("g0", "g1", RelocationState.PENDING)
    _, notices = rt.take_changes()
    assert any(n.kind.value == "relocate" and set(n.nodes) == {"r0", "t0"} for n in notices)

    for _ in range(3):  # C holds Rollout(0), then Train(0), then Sync(0): none is a boundary
        p = rt.state.permits["C"]
        rt.acquire("C", p.phase, p.iteration)
        rec, note = rt.ack_relocation("C", rec.epoch)
        assert rec.state is RelocationState.PENDING and "boundary" in note
        assert rt.state.jobs["C"].group_id == "g0"
        rt.release("C", rt.state.permits["C"].epoch, 1.0)
    rec, _ = rt.ack_relocation("C", rec.epoch)  # next: Rollout(1), not handed out yet

    assert rec.state is RelocationState.SWITCHED and rec.switched_epoch > rec.epoch
    assert (rec.rollout_nodes, rec.train_nodes) == (("r1",), ("t1",))
    assert list(rt.state.placement.groups) == ["g1"] and list(rt.state.placement.groups["g1"].members) == ["B", "C"]
    assert {"r0", "t0"}.isdisjoint(rt.state.placement.node_group)  # g0's nodes released
    assert (rt.state.permits["C"].phase, rt.state.permits["C"].iteration) == (Phase.ROLLOUT, 1)  # iteration count kept
    assert rt.state.jobs["C"].moves == 1
    rt.check_invariants()
    writes, _ = rt.take_changes()
    assert writes["group/g0"] is None and "relocation/C" in writes

    again, note = rt.ack_relocation("C", rec.epoch)  # a retried ack changes nothing
    assert again.state is RelocationState.SWITCHED and "already" in note
    assert rt.take_changes()[0] == {}
    ran = drive(rt, ["B", "C"], lambda: rt.state.permits["C"].iteration == 4)  # C runs on, taking turns with B
    order = [(ph, it) for j, ph, it in ran if j == "C"]
    assert order == [(ph, it) for it in (1, 2, 3) for ph in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC)]
    assert any(j == "B" for j, *_ in ran)


def test_a_rollout_granted_on_the_old_nodes_but_not_handed_out_is_taken_back() -> None:
    rt, _ = scenario()
    rt.remove_job("A", reason="deregistered")
    permit = rt.state.permits["C"]
    assert permit.state is PermitState.GRANTED and not permit.picked and permit.nodes == ("r0",)
    rec, _ = rt.ack_relocation("C", rt.directives.relocations["C"].epoch)
    assert rec.state is RelocationState.SWITCHED
    assert "r0" not in rt.leases.holder and rt.state.permits["C"].nodes in ((), ("r1",))
    rt.check_invariants()


def test_an_unhonoured_directive_expires_and_the_job_keeps_its_place() -> None:
    rt, clock = scenario(ServiceConfig(relocation_deadline_s=5.0))
    rt.remove_job("A", reason="deregistered")
    rec = rt.directives.relocations["C"]
    assert rt.next_deadline() is not None and rt.next_deadline() <= clock() + 5.0
    clock.advance(6.0)
    rt.expire()
    assert rec.state is RelocationState.EXPIRED
    assert rt.ack_relocation("C", rec.epoch)[0].state is RelocationState.EXPIRED
    assert rt.state.jobs["C"].group_id == "g0" and set(rt.state.placement.groups) == {"g0", "g1"}
    assert rt.plan_relocations(["g0"]) is None  # not asked again
    with pytest.raises(FailedPreconditionError, match="no relocation directive with epoch"):
        rt.ack_relocation("C", rec.epoch + 100)
    rt.check_invariants()


def test_a_restart_between_directive_and_ack_neither_loses_nor_repeats_the_move() -> None:
    rt, clock = scenario()
    rt.remove_job("A", reason="deregistered")
    epoch = rt.directives.relocations["C"].epoch

    def reload(old: Runtime) -> Runtime:
        return Runtime.from_records(old.records(), old.state.cluster, old.state.config, clock=clock, wall=clock)

    rt = reload(rt)
    rec = rt.directives.relocations["C"]
    assert rec.state is RelocationState.PENDING and rec.epoch == epoch
    for n in list(rt.state.nodes):
        rt.node_connected(n)
    assert rt.state.permits["C"].picked  # a reloaded grant may be running: wait for the next boundary
    assert rt.ack_relocation("C", epoch)[0].state is RelocationState.PENDING
    for _ in range(3):
        run_phase(rt, "C")
    assert rt.ack_relocation("C", epoch)[0].state is RelocationState.SWITCHED
    rt = reload(rt)
    for n in list(rt.state.nodes):
        rt.node_connected(n)
    rec, _ = rt.ack_relocation("C", epoch)
    assert rec.state is RelocationState.SWITCHED and rt.state.jobs["C"].moves == 1
    assert list(rt.state.placement.groups) == ["g1"] and list(rt.state.placement.groups["g1"].members) == ["B", "C"]
    rt.check_invariants()


def test_regrouping_off_issues_no_directive() -> None:
    rt, _ = scenario(ServiceConfig(policy=PolicyConfig.live(regroup=False)))
    rt.remove_job("A", reason="deregistered")
    assert rt.directives.relocations == {} and set(rt.state.placement.groups) == {"g0", "g1"}


def test_released_durations_teach_the_profile_and_survive_a_reload() -> None:
    rt, clock = scenario(ServiceConfig(policy=PolicyConfig.live(regroup=False)))
    assert not rt.state.placement.groups["g0"].members["C"].profile.learned
    rt.remove_job("A", reason="deregistered")
    for _ in range(5):  # five iterations of 2 s rollout and 3 s train + sync
        for seconds in (2.0, 2.5, 0.5):
            run_phase(rt, "C", seconds)
    gid = rt.state.jobs["C"].group_id
    m = rt.state.placement.groups[gid].members["C"]
    profile = m.profile
    assert profile.learned and profile.t_roll_s == pytest.approx(2.0)
    assert profile.t_train_s == pytest.approx(3.0 / m.train_factor)
    assert profile.t_solo_s < rt.state.jobs["C"].spec.t_solo_s  # the SLO is judged against what it really takes
    writes, _ = rt.take_changes()
    assert "learn/C" in writes
    again = Runtime.from_records(rt.records(), rt.state.cluster, rt.state.config, clock=clock, wall=clock)
    assert again.state.placement.groups[gid].members["C"].profile == profile


def test_learning_off_keeps_the_worst_case() -> None:
    rt, _ = scenario(ServiceConfig(policy=PolicyConfig.live(learn=False)))
    for _ in range(5):
        for _ in range(3):
            run_phase(rt, "B", 0.5)
    assert not rt.state.placement.groups["g1"].members["B"].profile.learned and rt.learning.learned == {}


@pytest.mark.parametrize("cap", [0, 1], ids=["cap-0-never-moves", "cap-1-moves-once"])
def test_the_move_cap_is_the_policys(cap: int) -> None:
    config = ServiceConfig()
    rt, _ = scenario(config, RollMuxPolicy(replace(live_policy_config(config), max_moves_per_job=cap)))
    rt.remove_job("A", reason="deregistered")
    assert ("C" in rt.directives.relocations) is (cap > 0)
