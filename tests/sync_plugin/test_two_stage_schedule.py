"""The rollout side's operation order across its two communicators (pure: no torch.distributed)."""

from __future__ import annotations

import itertools

import pytest

from rollmux.sync_plugin.two_stage import Step, ordered_communicators, receive_schedule

CASES = list(itertools.product([0, 1, 2, 7], [1, 2, 3], [True, False]))
IDS = [f"{n}buckets-depth{d}-{'ordered' if o else 'overlapped'}" for n, d, o in CASES]


def _outstanding(schedule: list[tuple[Step, int]]) -> list[tuple[set[int], set[int]]]:
    """After each step: buckets with stage-1 receives outstanding, and with a gather outstanding."""
    recv: set[int] = set()
    gather: set[int] = set()
    states = []
    for step, k in schedule:
        if step is Step.RECV:
            recv.add(k)
        elif step is Step.WAIT_RECV:
            recv.discard(k)
        elif step is Step.GATHER:
            gather.add(k)
        else:  # WAIT_GATHER, or UNPACK, which waits for the gather itself
            gather.discard(k)
        states.append((set(recv), set(gather)))
    return states


@pytest.mark.parametrize(("n", "depth", "ordered"), CASES, ids=IDS)
def test_every_bucket_is_received_gathered_and_unpacked_once_in_order(n: int, depth: int, ordered: bool) -> None:
    schedule = receive_schedule(n, depth, ordered=ordered)
    for k in range(n):
        steps = [s for s, b in schedule if b == k]
        assert [s for s in steps if s is not Step.WAIT_GATHER] == [Step.RECV, Step.WAIT_RECV, Step.GATHER, Step.UNPACK]
    assert {b for _, b in schedule} == set(range(n))


@pytest.mark.parametrize(("n", "depth"), [(n, d) for n, d, o in CASES if o])
def test_nccl_never_has_both_communicators_busy(n: int, depth: int) -> None:
    assert ordered_communicators("nccl")
    for recv, gather in _outstanding(receive_schedule(n, depth, ordered=True)):
        assert not (recv and gather), "a stage-1 receive and a stage-2 all-gather were outstanding together"


def test_gloo_keeps_stage_one_posted_while_gathering() -> None:
    assert not ordered_communicators("gloo")
    states = _outstanding(receive_schedule(4, 2, ordered=False))
    assert any(recv and gather for recv, gather in states)  # the pipelining gloo allows
