"""What the veRL adapter wraps, and how each call maps to a RollMux phase boundary (veRL 0.9.x).

Both trainers veRL ships funnel rollout sleep / wake and weight sync through
``CheckpointEngineManager`` (``auto_await`` facades: the inner coroutine is wrapped and the facade
re-applied, so sync and async callers both keep working):

=============================================  =====================================================
call                                           boundary
=============================================  =====================================================
``PPOTrainer.prepare_step`` (v1),              rollout begins (batch submitted to the agent loop)
``AgentLoopManager.generate_sequences`` (v0),  (v1 validation after a step's sync, too: it runs in
``AgentLoopManagerTQ.generate_sequences`` (v1)  the next rollout's permit)
``CheckpointEngineManager.wake_up_replicas``   rollout begins
``CheckpointEngineManager.sleep_replicas``     rollout ends (replicas release their memory)
``CheckpointEngineManager.                     rollout begins when no phase is open (``colocate_async``
resume_generation_replicas``                   resumes its partial rollout after the weight push);
                                               inside a disaggregated backend's ``update_weights``
                                               it is part of the sync
old/ref log-prob, values, reward, critic and   train begins (the trainer object is remembered for
actor updates (both trainers)                  the offload between phases)
``CheckpointEngineManager.update_weights``     sync (the whole call); before the first rollout it
                                               is the initial weight push and opens rollout(0). A
                                               ``naive`` push at sync is deferred to the next
                                               rollout's start (:mod:`.memory`). A pending
                                               relocation directive is honoured at its end
                                               (:mod:`.relocation`)
``TrainingWorker.to`` (worker processes)       none: the device cache is emptied after a move to
                                               the host (:mod:`.memory`)
``_load_checkpoint`` (both trainers)           a relocated job resumed at the step it left
``ReplayBuffer._wait_for_next_poll`` (v1)      rollout progress to ``runtime_hook`` (one-node rollouts)
``PPOTrainer.fit`` / ``RayPPOTrainer.fit``     the open phase ends (an open rollout after its
                                               replicas' requests are aborted), the job deregisters
``constants_ppo.get_ppo_ray_runtime_env``      (driver) registration + runtime environment
``Worker.__init__`` (every worker-group actor:  the process attaches as a rank on its own node's
FSDP actor / rollout / ref / critic),          sidecar and follows the job's phases there
``vLLMHttpServer.__init__``,                   (``rollmux.adapters.common.ranks``; once per process)
``SGLangHttpServer.__init__``
=============================================  =====================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from rollmux.adapters.common import PatchTarget, begins, ends, ranks
from rollmux.adapters.common.phases import around
from rollmux.adapters.verl import driver, offload, relocation, runner
from rollmux.shim import env

SUPPORTED = ">=0.9,<0.10"
"""veRL versions this adapter knows (declared once; checked before any patch)."""

CKPT = "verl.checkpoint_engine.base"
V1 = "verl.trainer.ppo.v1.trainer_base"
V0 = "verl.trainer.ppo.ray_trainer"
AGENT = "verl.experimental.agent_loop.agent_loop"
AGENT_TQ = "verl.trainer.ppo.v1.agent_loop_tq"
REPLAY = "verl.trainer.ppo.v1.replay_buffer"
WORKER = "verl.single_controller.base.worker"
WORKERS = "verl.workers.engine_workers"
SERVERS = (("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer"),
           ("verl.workers.rollout.sglang_rollout.async_sglang_server", "SGLangHttpServer"))
"""Rollout server actors that hold GPU memory on their node (imported only where that engine is installed)."""
TRAIN_METHODS = ("_compute_reward_colocate", "_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values",
                 "_update_critic", "_update_actor")


def _auto_await(func: Callable[..., Any]) -> Callable[..., Any]:
    return sys.modules["verl.utils.ray_utils"].auto_await(func)  # loaded: the target module imported it


def _train(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    r = runner.runner()
    if r is not None and not r.finished:
        r.trainer = instance
        r.tracker.begin("train")
    return wrapped(*args, **kwargs)


def _weights_before() -> None:
    t = runner.tracker()
    if t is not None:
        t.begin("rollout" if t.upcoming == "rollout" else "sync")


def _weights_after() -> None:
    r = runner.runner()
    if r is not None and not r.finished:
        relocation.at_sync_end(r)  # closes Sync; the initial push stays inside rollout(0)


def _resumed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    r = runner.runner()
    if r is not None and not r.finished:
        r.check_resumed(instance)
    return result


def _resume_before() -> None:
    t = runner.tracker()
    if t is None:
        return
    if t.current is None and t.upcoming == "rollout":
        t.begin("rollout")
    runner.record("resume_generation", job=os.environ.get(env.JOB, ""), phase=t.current, iteration=t.iteration)


def _progress(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    r = runner.runner()
    if r is not None and not r.finished and r.tracker.current == "rollout":
        partition = args[0] if args else kwargs.get("partition_id", "train")
        done = len(instance.finished_keys[partition])
        total = done + len(instance.pending_keys[partition]) + len(instance.running_keys[partition])
        r.progress(done, total)  # consolidating the tail is not supported for veRL (docs/how-to/run-verl.md)
    return result


def _finish(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    r = runner.runner()
    if r is not None:
        if not r.finished and r.tracker.current == "rollout":
            # fit returned inside a rollout: colocate_async resumed generation for prompts no step will
            # use (or a final validation ran); stop the replicas before the permit goes
            manager = getattr(instance, "checkpoint_manager", None)
            if manager is not None:
                manager.abort_replicas()
        r.finish()
    return result


def _tracker() -> Any:
    return runner.tracker()


def _attach_rank(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """After a GPU process's constructor: attach it as a rank on its node's sidecar (once per process)."""
    result = wrapped(*args, **kwargs)
    ranks.attach_here(type(instance).__name__)
    return result


def targets() -> list[PatchTarget]:
    """Every target, in both trainers."""
    out = [
        PatchTarget(module="verl.trainer.constants_ppo", attribute="get_ppo_ray_runtime_env",
                    wrapper=driver.runtime_env_wrapper),
        PatchTarget(module=CKPT, attribute="CheckpointEngineManager.update_weights",
                    wrapper=offload.update_weights(_weights_before, _weights_after, lambda: runner.runner()),
                    inner=True,
                    redecorate=_auto_await),
        PatchTarget(module=WORKERS, attribute="TrainingWorker.to", wrapper=offload.worker_to),
        PatchTarget(module=CKPT, attribute="CheckpointEngineManager.sleep_replicas",
                    wrapper=ends(_tracker, "rollout"), inner=True, redecorate=_auto_await),
        PatchTarget(module=CKPT, attribute="CheckpointEngineManager.wake_up_replicas",
                    wrapper=begins(_tracker, "rollout"), inner=True, redecorate=_auto_await),
        PatchTarget(module=CKPT, attribute="CheckpointEngineManager.resume_generation_replicas",
                    wrapper=around(_resume_before, None), inner=True, redecorate=_auto_await),
        PatchTarget(module=V1, attribute="PPOTrainer.prepare_step", wrapper=begins(_tracker, "rollout")),
        PatchTarget(module=V1, attribute="PPOTrainer.fit", wrapper=_finish),
        PatchTarget(module=V0, attribute="RayPPOTrainer.fit", wrapper=_finish),
        PatchTarget(module=AGENT, attribute="AgentLoopManager.generate_sequences", wrapper=begins(_tracker, "rollout"),
                    inner=True, redecorate=_auto_await),
        PatchTarget(module=AGENT_TQ, attribute="AgentLoopManagerTQ.generate_sequences",
                    wrapper=begins(_tracker, "rollout")),
        PatchTarget(module=REPLAY, attribute="ReplayBuffer._wait_for_next_poll", wrapper=_progress),
        PatchTarget(module=WORKER, attribute="Worker.__init__", wrapper=_attach_rank),
        *(PatchTarget(module=m, attribute=f"{cls}.__init__", wrapper=_attach_rank, required=False)
          for m, cls in SERVERS),
    ]
    for module, cls in ((V1, "PPOTrainer"), (V0, "RayPPOTrainer")):
        out += [PatchTarget(module=module, attribute=f"{cls}.{m}", wrapper=_train) for m in TRAIN_METHODS]
        out.append(PatchTarget(module=module, attribute=f"{cls}._load_checkpoint", wrapper=_resumed))
    return out
