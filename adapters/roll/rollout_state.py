"""An ``AgenticPipeline``'s rollout position: saved with a relocation checkpoint, given back on the restart.

ROLL checkpoints an agentic job's model side as RLVR's, but not its ``RolloutScheduler``s (read in ROLL
8eb27cc2, docs/how-to/run-roll.md "Relocation"): a rebuilt scheduler numbers episodes from 0 again
(``GroupQueue.next_episode_id``, one queue per env group, in the ``GroupQueueManager`` actor) and draws a
fresh rollout-loop seed (``random.randint`` in ``_get_batch_impl``, train mode); every env manager seeds
its env with ``loop seed + group_seed + episode_id``. So for a relocation checkpoint the adapter saves,
per scheduler (train and val), the loop seed, each group queue's ``next_episode_id`` and
``current_step``, and each env group's ``group_seed`` (drawn with ``random.randint`` in the driver when
``AgenticConfig`` is built) into ``state.kv[KV_KEY]`` right before ROLL's ``do_checkpoint`` writes the
pipeline's ``WorkerState`` (as RLVR's ``scheduler_state_<domain>``). The restart puts the group seeds
into its config before ROLL builds the env managers (:func:`restore_config`), and the rest into the
rebuilt schedulers once ROLL loaded that checkpoint, before the first rollout (:func:`restore`; the env
managers' loop starts at the first ``get_batch``). Groups a step left unconsumed are not saved: a synchronous step (the only kind the
adapter runs) expires them at the next ``advance_step`` anyway.

Runs in the driver (:func:`save`, :func:`restore`, through ``__ray_call__`` on the scheduler and queue
actors) and in the scheduler's actor (:func:`wrap_rollout_loop`, from the patch registry).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rollmux.adapters.common.api import AdapterError

KV_KEY = "rollmux_rollout_schedulers"
"""The ``WorkerState.kv`` key of the saved rollout position (only in a relocation checkpoint)."""

SCHEDULERS = {"train_rollout_scheduler": "train_env_manager", "val_rollout_scheduler": "val_env_manager"}
"""The ``AgenticPipeline`` attributes holding its ``RolloutScheduler`` actors -> their ``AgenticConfig`` env manager."""

_SEED = "_rollmux_loop_seed"  # on a RolloutScheduler: the seed its running rollout loop was started with
_GIVEN = "_rollmux_given_seed"  # on a RolloutScheduler: the seed restore() handed back, for its next loop


def wrap_rollout_loop(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    """``RolloutScheduler._run_rollout_loop(seed)`` (in the scheduler's actor): remember the loop seed; the
    first loop of a restored scheduler runs under the saved seed instead of the fresh draw."""
    seed = kwargs.pop("seed", args[0] if args else None)
    given = getattr(instance, _GIVEN, None)
    if given is not None:
        seed = given
        setattr(instance, _GIVEN, None)
    setattr(instance, _SEED, seed)
    return wrapped(seed, **kwargs)


def _loop_seed(scheduler: Any) -> int | None:
    return getattr(scheduler, _SEED, None)


def _give_seed(scheduler: Any, seed: int | None) -> None:
    setattr(scheduler, _GIVEN, seed)


def _queue_of(scheduler: Any) -> Any:
    return scheduler.env_output_queue


def _queue_state(manager: Any) -> dict[str, dict[str, int | None]]:
    """In the ``GroupQueueManager`` actor: each group queue's episode counter and step (JSON keys: str)."""
    return {str(g): {"next_episode_id": int(q.next_episode_id), "current_step": q.current_step}
            for g, q in manager.group_queue.items()}


def _set_queue_state(manager: Any, groups: dict[str, dict[str, Any]]) -> None:
    for g, q in manager.group_queue.items():
        q.next_episode_id = int(groups[str(g)]["next_episode_id"])
        q.current_step = groups[str(g)]["current_step"]


def _schedulers(pipeline: Any) -> dict[str, Any]:
    return {name: h for name in SCHEDULERS if (h := getattr(pipeline, name, None)) is not None}


def _env_configs(cfg: Any, name: str) -> list[Any]:
    """Every env's config (``env_configs[rank][env_id]``) of scheduler `name`'s env manager in `cfg`."""
    manager = getattr(cfg, SCHEDULERS[name], None)
    return [e for rank in (getattr(manager, "env_configs", None) or {}).values() for e in rank.values()]


def _group_seeds(cfg: Any, name: str) -> dict[str, int]:
    return {str(e["group_id"]): int(e["group_seed"]) for e in _env_configs(cfg, name)}


def snapshot(pipeline: Any) -> dict[str, dict[str, Any]]:
    """Each scheduler's loop seed (None before its first rollout), group queues, and its env groups' seeds
    (``group_seed``, which ``AgenticConfig.make_env_configs`` draws with ``random.randint`` in the driver)."""
    import ray

    out: dict[str, dict[str, Any]] = {}
    for name, handle in _schedulers(pipeline).items():
        seed, queue = ray.get([handle.__ray_call__.remote(_loop_seed), handle.__ray_call__.remote(_queue_of)])
        out[name] = {"seed": seed, "groups": ray.get(queue.__ray_call__.remote(_queue_state)),
                     "group_seeds": _group_seeds(pipeline.pipeline_config, name)}
    return out


def save(pipeline: Any) -> dict[str, dict[str, Any]]:
    """Put the schedulers' position into ``state.kv`` for the checkpoint about to be written; returns it."""
    state = snapshot(pipeline)
    pipeline.state.kv[KV_KEY] = state
    return state


def forget(pipeline: Any) -> None:
    """Drop the saved position from ``state.kv`` once written (later checkpoints are not relocations)."""
    pipeline.state.kv.pop(KV_KEY, None)


def restore_config(cfg: Any, checkpoint: str, job: str) -> None:
    """Before ROLL builds the pipeline: give an ``AgenticConfig``'s env configs the group seeds saved in the
    relocation checkpoint (ROLL's ``WorkerState`` JSON in ``<checkpoint>/pipeline``, as ROLL loads it), so
    the rebuilt env managers seed their envs as the moved run's did.

    Raises:
        AdapterError: the checkpoint holds no saved position, or its env groups differ from `cfg`'s.
    """
    from roll.utils.worker_state import WorkerState

    saved = WorkerState.load_from_json(load_dir=os.path.join(checkpoint, "pipeline"), tag="pipeline").kv.get(KV_KEY)
    if saved is None:
        raise _missing(job)
    for name, state in saved.items():
        envs = _env_configs(cfg, name)
        _same_groups(job, name, state["group_seeds"], {str(e["group_id"]) for e in envs})
        for e in envs:
            e["group_seed"] = int(state["group_seeds"][str(e["group_id"])])


def _missing(job: str) -> AdapterError:
    return AdapterError(f"RollMux: job {job!r} resumes a relocation checkpoint without its rollout schedulers' "
                        f"position (state.kv[{KV_KEY!r}]): restart it with the checkpoint named in the marker")


def _same_groups(job: str, name: str, saved: Any, ours: Any) -> None:
    if set(saved) != set(ours):
        raise AdapterError(f"RollMux: job {job!r} was relocated with {name} env groups {sorted(saved)} but this "
                           f"run has {sorted(ours)}: restart it with the same env manager config")


def restore(pipeline: Any, job: str) -> dict[str, dict[str, Any]]:
    """Give the rebuilt schedulers the position ROLL just loaded from the relocation checkpoint.

    Raises:
        AdapterError: the checkpoint holds no saved position, or its env groups differ from this run's.
    """
    import ray

    saved = (getattr(pipeline.state, "kv", None) or {}).get(KV_KEY)
    if saved is None:
        raise _missing(job)
    for name, handle in _schedulers(pipeline).items():
        if name not in saved:
            continue
        queue = ray.get(handle.__ray_call__.remote(_queue_of))
        groups = saved[name]["groups"]
        _same_groups(job, name, groups, ray.get(queue.__ray_call__.remote(_queue_state)))
        ray.get([queue.__ray_call__.remote(_set_queue_state, groups),
                 handle.__ray_call__.remote(_give_seed, saved[name]["seed"])])
    forget(pipeline)
    return saved
