"""The vLLM sleep-mode helper, driven against a FAKE engine (vLLM is not installable on CPU here).

``FakeSleepingLLM`` is a fake, not vLLM: it only records the calls and mimics the contract of
``vllm.LLM.sleep(level)`` / ``wake_up(tags)`` (tags ``weights`` and ``kv_cache``). A real-vLLM test
belongs with the GPU tests.
"""

from __future__ import annotations

import pytest

from rollmux.shim.state_cache import CacheState, CacheTransitionError
from rollmux.shim.vllm_sleep import SleepModeUnavailableError, VllmSleep


class FakeSleepingLLM:
    """FAKE stand-in for ``vllm.LLM(..., enable_sleep_mode=True)``; records every call."""

    def __init__(self, fail_wake: bool = False) -> None:
        self.calls: list[tuple[str, object]] = []
        self.awake = {"weights", "kv_cache"}
        self.fail_wake = fail_wake

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        self.awake.clear()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))
        if self.fail_wake:
            raise MemoryError("fake: out of device memory")
        self.awake |= set(tags or ("weights", "kv_cache"))


def test_sleep_level_1_then_wake_and_idempotence() -> None:
    llm = FakeSleepingLLM()
    helper = VllmSleep(llm, job_id="j")
    helper.offload()
    assert helper.offload().noop
    assert helper.state is CacheState.OFFLOADED and not llm.awake
    helper.reload()
    assert helper.reload().noop
    assert llm.calls == [("sleep", 1), ("wake_up", None)]
    assert [r.dst for r in helper.history] == [
        CacheState.OFFLOADING,
        CacheState.OFFLOADED,
        CacheState.LOADING,
        CacheState.RESIDENT,
    ]


def test_weights_woken_before_update_and_kv_cache_after() -> None:
    llm = FakeSleepingLLM()
    helper = VllmSleep(llm)
    helper.offload()
    seen: list[set[str]] = []
    helper.reload_weights_first(lambda: seen.append(set(llm.awake)))
    assert seen == [{"weights"}]
    assert llm.calls[1:] == [("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    assert helper.state is CacheState.RESIDENT


def test_failed_wake_rolls_back_to_offloaded() -> None:
    helper = VllmSleep(FakeSleepingLLM(fail_wake=True))
    helper.offload()
    with pytest.raises(MemoryError):
        helper.reload()
    assert helper.state is CacheState.OFFLOADED
    helper.transition(CacheState.LOADING)  # as if another thread were reloading
    with pytest.raises(CacheTransitionError):
        helper.offload()


def test_engine_without_sleep_mode_is_refused_with_a_remedy() -> None:
    with pytest.raises(SleepModeUnavailableError, match="enable_sleep_mode=True"):
        VllmSleep(object())
    with pytest.raises(ValueError, match="level"):
        VllmSleep(FakeSleepingLLM(), level=3)
