"""The admission queue decides a pending job again only when what it did not fit with changed.

Compared with deciding every pending job on every event (`remember_unfit` off), the queue admits the same jobs into the same groups on the same nodes, on seeded random traces.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from rollmux.coordinator.policy import RollMuxPolicy
from rollmux.coordinator.service.runtime import Runtime
from rollmux.coordinator.service.runtime.api import JobState, ServiceConfig
from rollmux.coordinator.service.runtime.state import live_policy_config
from rollmux.core.model import ClusterSpec, JobSpec, Pool

from .builders import TB, FakeClock, grant, make_runtime, register


class CountingPolicy(RollMuxPolicy):
    """RollMux's policy, counting the jobs it was asked to place as the head job of a decision."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.asked: list[str] = []

    def place(self, job: JobSpec, state: Any, **kw: Any) -> Any:
        self.asked.append(job.name)
        return super().place(job, state, **kw)


def counting_runtime(n_rollout: int = 4, n_train: int = 2) -> tuple[Runtime, CountingPolicy]:
    clock = FakeClock()
    config = ServiceConfig(heartbeat_interval_s=1e6)
    policy = CountingPolicy(live_policy_config(config))
    rt = Runtime(ClusterSpec(), config, clock=clock, wall=clock, policy=policy)
    for pool, prefix, n, gpu in ((Pool.ROLLOUT, "r", n_rollout, "H20"), (Pool.TRAIN, "t", n_train, "H800")):
        for i in range(n):
            rt.register_node(node_id=f"{prefix}{i}", pool=pool, gpu_type=gpu, gpu_count=8, host_dram_bytes=2 * TB,
                             nvml={})
            rt.node_connected(f"{prefix}{i}")
    return rt, policy


def fill_and_queue(rt: Runtime, queued: int) -> None:
    """One admitted job per training node, then `queued` jobs of 3 training nodes (never fit 2)."""
    for k in range(2):
        register(rt, f"fit{k}", nt=8)
    for j in range(queued):
        register(rt, f"q{j}", nt=24)


def test_a_registration_decides_only_the_new_job_when_nothing_else_changed() -> None:
    rt, policy = counting_runtime()
    fill_and_queue(rt, 12)
    assert [j for j in rt.state.jobs.values() if j.state is JobState.ADMITTED] == [rt.state.jobs["fit0"], rt.state.jobs["fit1"]]
    policy.asked.clear()
    register(rt, "q12", nt=24)
    # the new job, and on scratch forks the pending jobs its lookahead prices (the first of the queue)
    lookahead = {f"q{j}" for j in range(policy.config.lookahead_jobs)}
    assert "q12" in policy.asked and set(policy.asked) <= {"q12"} | lookahead, sorted(set(policy.asked))


def test_decisions_per_registration_do_not_grow_with_the_queue() -> None:
    rt, policy = counting_runtime()
    fill_and_queue(rt, 10)
    policy.asked.clear()
    register(rt, "q10", nt=24)
    at_10 = len(policy.asked)
    for j in range(11, 25):
        register(rt, f"q{j}", nt=24)
    policy.asked.clear()
    register(rt, "q25", nt=24)
    assert 0 < len(policy.asked) <= at_10


def test_a_new_node_decides_the_queue_again_in_arrival_order() -> None:
    rt, _ = make_runtime(4, 2)
    register(rt, "first", nt=24)  # 3 training nodes of 2
    register(rt, "second", nt=24)
    assert rt.state.pending() == ["first", "second"]
    rt.register_node(node_id="t2", pool=Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=2 * TB, nvml={})
    rt.node_connected("t2")
    assert rt.state.jobs["first"].state is JobState.ADMITTED and rt.state.jobs["first"].group_id == "g0"
    assert rt.state.jobs["second"].state is JobState.ADMITTED  # it joins the group (the pool's 3 nodes are taken)


def test_a_node_coming_back_decides_the_queue_again() -> None:
    rt, _ = make_runtime(4, 3)
    rt.node_disconnected("t2")
    register(rt, "wide", nt=24)  # 3 training nodes, 2 READY: decided, remembered as unfit
    assert rt.state.jobs["wide"].state is JobState.PENDING and "wide" in rt.admission.unfit
    register(rt, "also", nt=24)  # nothing changed for "wide": not decided again, still pending
    assert rt.state.pending() == ["wide", "also"]
    rt.node_connected("t2")
    assert rt.state.jobs["wide"].state is JobState.ADMITTED and "t2" in rt.state.job_nodes(rt.state.jobs["wide"])


STEPS = 40  # a few seconds a seed on one core: deciding every job on every event is the slow half


def snapshot(rt: Runtime) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    return {n: (j.state.value, j.group_id, rt.state.job_nodes(j)) for n, j in sorted(rt.state.jobs.items())}


def random_trace(seed: int, *, steps: int, full: bool) -> list[dict[str, tuple[str, str, tuple[str, ...]]]]:
    """Registrations, departures, attachments, nodes lost and back on 6 rollout and 4 training nodes; the snapshot
    after every event. `full`: every pending job decided on every event (`remember_unfit` off)."""
    rng = random.Random(seed)
    rt, _ = make_runtime(6, 4)
    seen: list[dict[str, tuple[str, str, tuple[str, ...]]]] = []
    lost: set[str] = set()
    rt.admission.remember_unfit = not full
    for step in range(steps):
        roll = rng.random()
        if roll < 0.55 or not rt.state.jobs:
            register(rt, f"j{step}", nr=8 * rng.choice([1, 1, 2]), nt=8 * rng.choice([1, 1, 2, 3]),
                     t_roll_s=rng.choice([60.0, 100.0, 200.0]), t_train_s=rng.choice([40.0, 100.0, 150.0]),
                     slo=rng.choice([1.2, 1.5, 2.0]))
        elif roll < 0.8:
            rt.remove_job(rng.choice(sorted(rt.state.jobs)), reason="done")
        elif roll < 0.85 and rt.state.pending():  # a pending job's ranks attached on a free node
            free = sorted(n for n in rt.state.nodes if n not in rt.state.placement.node_group and n not in lost)
            if free:
                rt.report_attach(rng.choice(rt.state.pending()), rng.choice(free))
        elif lost and roll < 0.92:
            node = rng.choice(sorted(lost))
            lost.discard(node)
            rt.node_connected(node)
        else:
            free = sorted(n for n in rt.state.nodes if n not in rt.state.placement.node_group and n not in lost)
            if free:
                node = rng.choice(free)
                lost.add(node)
                rt.node_disconnected(node)
        seen.append(snapshot(rt))
    return seen


def test_after_a_departure_a_queue_of_one_shape_costs_a_few_decisions() -> None:
    rt, policy = counting_runtime()
    fill_and_queue(rt, 20)
    policy.asked.clear()
    rt.remove_job("fit0", reason="done")  # the capacity changed, but 3 training nodes still do not fit in 2
    assert rt.state.pending() == [f"q{j}" for j in range(20)]
    window = policy.config.lookahead_jobs  # q0..q{window} see different pending jobs; the rest see q0..q{window-1}
    queued = {name for name in policy.asked if name.startswith("q")}  # (fit1 is priced for moves: `departed`)
    assert queued and queued <= {f"q{j}" for j in range(window + 1)}, sorted(queued)


@pytest.mark.parametrize("seed", [0, 3])
def test_the_queue_admits_as_deciding_every_job_on_every_event_would(seed: int) -> None:
    remembered = random_trace(seed, steps=STEPS, full=False)
    everything = random_trace(seed, steps=STEPS, full=True)
    assert remembered == everything
    pending = [s for s in remembered if any(v[0] == "pending" for v in s.values())]
    assert pending, "the trace queues jobs (else it checks nothing)"


def test_a_measured_iteration_counts_as_a_capacity_change() -> None:
    """An iteration's times move the fleet prior a pending job is judged with: the queue is decided again."""
    rt, _ = make_runtime(4, 2)
    register(rt, "a", nt=8)
    register(rt, "wide", nt=24)
    before = rt.state.capacity_version
    for _ in range(3):  # Rollout, Train, Sync: one measured iteration
        permit = grant(rt, "a")
        rt.release("a", permit.epoch, 1.0)
    assert rt.state.capacity_version > before
