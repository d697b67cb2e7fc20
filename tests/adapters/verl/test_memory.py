"""What an opted-in veRL job frees between phases and which trainer modes the adapter gates, read off
veRL 0.9.1's own default config (``verl/trainer/config/ppo_trainer.yaml`` composed with Hydra, as
``main_ppo`` does; a struct config)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollmux.adapters.common import AdapterError
from rollmux.adapters.verl import driver, memory, spec
from rollmux.core.model import Deployment


def compose(*overrides: str) -> object:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


@pytest.mark.parametrize(("overrides", "level", "released"), [
    ((), 2, ("kv_cache", "weights")),  # veRL's default: the next sync pushes every weight
    (("actor_rollout_ref.model.lora_rank=8",), 1, ("kv_cache", "weights")),  # LoRA adapter: base weights kept
    (("actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.merge=True"), 2, ("kv_cache", "weights")),
    (("actor_rollout_ref.model.mtp.enable=True", "actor_rollout_ref.model.mtp.enable_rollout=True"), 1,
     ("kv_cache", "weights")),
    (("actor_rollout_ref.rollout.name=sglang",), None, ("kv_cache", "weights")),
    (("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.model.lora_rank=8"), None, ("kv_cache",)),
])
def test_sleep_level_follows_what_the_next_weight_push_restores(overrides: tuple[str, ...], level: int | None,
                                                                released: tuple[str, ...]) -> None:
    plan = memory.sleep_plan(compose(*overrides))
    assert (plan.level, plan.released, plan.frees_gpu) == (level, released, True)


def test_opted_in_the_driver_turns_the_rollout_engines_sleep_back_on() -> None:
    cfg = compose("actor_rollout_ref.rollout.free_cache_engine=False")
    assert memory.sleep_plan(cfg).frees_gpu is False and memory.sleep_plan(cfg).released == ()
    assert memory.ensure_memory_freed(cfg) == ["actor_rollout_ref.rollout.free_cache_engine=True"]
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is True  # type: ignore[attr-defined]
    assert memory.ensure_memory_freed(cfg) == [] and memory.sleep_plan(cfg).frees_gpu


SEPARATE = ("trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1")


@pytest.mark.parametrize(("overrides", "mode", "gated", "deployment"), [
    ((), "sync", True, Deployment.COLOCATED_TRAIN),
    (("actor_rollout_ref.rollout.nnodes=1",), "sync", True, Deployment.COLOCATED_TRAIN),  # v1 sync ignores it
    (("trainer.v1.trainer_mode=colocate_async",), "colocate_async", True, Deployment.COLOCATED_TRAIN),
    (("trainer.use_v1=False",), "legacy", True, Deployment.COLOCATED_TRAIN),
    (SEPARATE, "separate_async", False, Deployment.DISAGGREGATED),
])
def test_trainer_modes(overrides: tuple[str, ...], mode: str, gated: bool, deployment: Deployment) -> None:
    cfg = compose(*overrides)
    assert spec.trainer_mode(cfg) == mode
    assert (spec.unsupported(cfg) is None) is gated
    assert spec.job_spec(cfg, name="j", slo=1.5, params=1000).deployment is deployment


def test_separate_async_is_refused_before_the_sidecar_is_even_looked_for(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMUX_SIDECAR_SOCKET", str(tmp_path / "missing.sock"))
    with pytest.raises(AdapterError, match="separate_async .* unset ROLLMUX_SIDECAR_SOCKET"):
        driver.register_from_config(compose(*SEPARATE))
    with pytest.raises(AdapterError, match="no sidecar socket exists"):  # a gated mode gets to the sidecar check
        driver.register_from_config(compose("trainer.v1.trainer_mode=colocate_async"))
    assert driver.identity() is None


@pytest.mark.parametrize(("backend", "phase", "timing"), [
    ("naive", "sync", memory.PushTiming.NEXT_ROLLOUT),  # would wake the co-located engine until the next rollout
    ("naive", "rollout", memory.PushTiming.NOW),  # the first push, or one that wakes the engine for a rollout
    ("naive", None, memory.PushTiming.NOW),  # a process that gates nothing
    ("nccl", "sync", memory.PushTiming.NOW),  # disaggregated engines: not on the Sync permit's nodes
    ("rollmux", "sync", memory.PushTiming.NOW),
], ids=["naive-sync", "naive-rollout", "naive-ungated", "nccl-sync", "rollmux-sync"])
def test_a_colocated_push_at_sync_waits_for_the_next_rollout(backend: str, phase: str | None,
                                                             timing: memory.PushTiming) -> None:
    assert memory.push_timing(backend=backend, phase=phase) is timing


def test_a_deferred_push_reloads_the_model_only_when_the_runner_offloaded_it() -> None:
    S = memory.PushStep
    assert memory.deferred_push_steps(runner_moves_state=True) == (S.RELOAD_MODEL, S.PUSH, S.OFFLOAD_MODEL)
    assert memory.deferred_push_steps(runner_moves_state=False) == (S.PUSH,)  # veRL offloads around its push


class RecordingEngine:
    """Stands in for veRL's FSDP engine on a CPU machine: records each move into the adapter's event log,
    so the worker's cache emptying can be ordered after it."""

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        from rollmux.adapters.common.relocation import record

        record("engine_to", device=device, optimizer=optimizer)


def test_the_worker_empties_its_device_cache_after_each_move_to_the_host(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """veRL's ``TrainingWorker.to`` wrapped in the worker with its ``@register`` metadata kept (worker groups
    bind it from there); the cache emptied after the engine moved the optimizer, never after a reload."""
    import verl.workers.engine_workers as workers
    from verl.single_controller.base.decorator import MAGIC_ATTR

    from rollmux.adapters.common import Patcher, is_patched
    from rollmux.adapters.common.registration import opted_in
    from rollmux.adapters.verl import targets
    from rollmux.shim import env

    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(env.EVENT_LOG, str(events))
    monkeypatch.setenv(env.JOB, "j")
    assert not opted_in()  # this process's veRL is not patched by the plugin: the test patches it alone
    dispatch = dict(getattr(workers.TrainingWorker.to, MAGIC_ATTR))
    patcher = Patcher(adapter="verl", distribution="verl", supported=targets.SUPPORTED, remedy="(test)",
                      targets=[t for t in targets.targets() if t.dotted == f"{targets.WORKERS}:TrainingWorker.to"])
    assert patcher.patch()
    try:
        assert is_patched(workers.TrainingWorker.to)
        assert getattr(workers.TrainingWorker.to, MAGIC_ATTR) == dispatch
        worker = object.__new__(workers.TrainingWorker)
        worker.engine = RecordingEngine()
        worker.to("cpu", model=True, optimizer=True, grad=True)
        worker.to("device", model=True, optimizer=True, grad=True)
        worker.to(device="cpu", model=True, optimizer=False, grad=False)
    finally:
        patcher.unpatch()
    assert not is_patched(workers.TrainingWorker.to)
    seen = [(r["event"], r.get("device"), r.get("job")) for r in map(json.loads, events.read_text().splitlines())]
    device = seen[2][1]
    assert seen == [("engine_to", "cpu", None), ("worker_cache_emptied", None, "j"), ("engine_to", device, None),
                    ("engine_to", "cpu", None), ("worker_cache_emptied", None, "j")]
