"""Worker-side wrappers: they run inside the job's Ray actors, where the package's ``.pth`` hook
loads the adapter because the driver passed the opt-in variable in the job's runtime environment.

* :func:`wrap_vllm_offload` / :func:`wrap_sglang_offload` (``VllmStrategy`` / ``SgLangStrategy``
  ``offload_states``): ROLL only puts the engine to sleep (vLLM) or releases its memory (SGLang) when
  actor_infer is colocated with training; in a disaggregated job the engine would keep its GPU
  memory between phases and the next job's rollout on that node could not load. Opted in, the
  engine releases it in both modes (vLLM at the configured ``sleep_level``; level 1 keeps the weights
  in host memory, and the next ``model_update`` overwrites them anyway). ROLL's loops already call
  ``actor_infer.offload_states()`` at the end of every rollout and ``load_states()`` before the next
  one, both inside the job's Rollout permit (``phases.py``); hf_infer offloads in both modes as shipped.
* :func:`wrap_worker_init` (``roll.distributed.executor.worker.Worker.__init__``, the base of every
  ROLL cluster worker): a worker that holds GPU memory (its cluster has a ``device_mapping``: actor_train,
  actor_infer, reference, critic, GPU reward workers) attaches as a rank of the job on its own node's
  sidecar (``rollmux.adapters.common.ranks``, invariant I3) and follows the driver's phases there.
* :func:`wrap_batch_rollout` / :func:`wrap_replay_get_batch` (RLVR's rollout scheduler actor) and
  :func:`wrap_agentic_batch` (the agentic ``RolloutScheduler`` actor, train mode): rollout progress
  (finished / total responses) goes to the rollout gate actor, which reports it through
  ``rollmux.runtime_hook``. As responses finish on ROLL's request path (``generate_opt_level`` 1, vLLM
  and SGLang; at most every ``PROGRESS_INTERVAL_S`` between a rollout's first and last report); start
  and end only on the batch path (``generate_opt_level`` 0) and for agentic rollouts (trajectories are
  counted inside ``GroupQueueManager``, a Ray actor class the adapter does not wrap). The gate logs a
  migration directive and does not follow it (docs/how-to/run-roll.md says why).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rollmux.adapters.common import ranks
from rollmux.adapters.roll.gate import gate_name

log = logging.getLogger(__name__)


def holds_gpu(worker_config: Any) -> bool:
    """Whether a ROLL worker holds GPU memory: its cluster maps devices (ROLL runs a worker with no
    ``device_mapping`` on the CPU only)."""
    return bool(getattr(worker_config, "device_mapping", None))


def wrap_worker_init(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    """After a ROLL worker's constructor (in its Ray actor): a GPU worker attaches as a rank on its node's
    sidecar, once per process (``ranks.attach_here``; a no-op in a process of no opted-in job)."""
    result = wrapped(*args, **kwargs)
    if holds_gpu(getattr(instance, "worker_config", None)):
        ranks.attach_here(type(instance).__name__)
    return result


def _release_disaggregated(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an engine's ``offload_states(include)`` call should release its GPU memory that ROLL keeps
    (actor_infer not colocated, model params included, the model still on the GPU)."""
    from roll.utils.offload_states import OffloadStateType

    include = kwargs.get("include", args[0] if args else None)
    colocated = bool(instance.worker.pipeline_config.is_actor_infer_colocated)
    weights = include is None or OffloadStateType.model_params in include
    return not colocated and weights and bool(instance.is_model_in_gpu)


def wrap_vllm_offload(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    """Sleep a disaggregated vLLM engine too (a coroutine, like the original)."""

    async def offload() -> Any:
        result = await wrapped(*args, **kwargs)
        if _release_disaggregated(instance, args, kwargs):
            await instance.model.offload_states(instance.sleep_level)
            instance.is_model_in_gpu = False
        return result

    return offload()


def wrap_sglang_offload(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
    """Release a disaggregated SGLang engine's memory too (weights, KV cache and CUDA graphs, as ROLL
    does when colocated; its ``load_states`` resumes whatever is released)."""

    async def offload() -> Any:
        release = _release_disaggregated(instance, args, kwargs)
        result = await wrapped(*args, **kwargs)
        if release:
            await instance.model.release_memory_occupation()
            instance.is_model_in_gpu, instance.is_kv_cache_in_gpu = False, False
        return result

    return offload()


PROGRESS_INTERVAL_S = 0.25
"""Least seconds between two progress reports of a rollout in between its first (0) and last (n / n): on
ROLL's request path every response would otherwise cost a gate call, a sidecar RPC and a coordinator write."""


class _Reporter:
    """This process's route to the job's rollout gate: the actor handle looked up once (two GCS lookups
    per report otherwise, on the rollout's path), and the time of the last report sent."""

    def __init__(self) -> None:
        self.gate: Any = None
        self.last_s = 0.0

    def due(self, finished: int, total: int) -> bool:
        now = time.monotonic()
        if finished in (0, total) or now - self.last_s >= PROGRESS_INTERVAL_S:
            self.last_s = now
            return True
        return False

    def send(self, finished: int, total: int) -> None:
        if self.gate is None:
            self.gate = _rollout_gate()
        self.gate.progress.remote(finished, total)


_reporter = _Reporter()


def _rollout_gate() -> Any:
    """The gate that holds the job's Rollout permit: the rollout pool's, or, in a co-located job (whose
    only gate is the training pool's), the training pool's."""
    import ray

    try:
        return ray.get_actor(gate_name("rollout"))
    except ValueError:  # no such actor
        return ray.get_actor(gate_name("train"))


def report_progress(finished: int, total: int) -> None:
    """Send rollout progress to the job's rollout gate (fire and forget; never fails the rollout). The
    first and last report of a rollout always go; those in between at most every ``PROGRESS_INTERVAL_S``."""
    if not _reporter.due(int(finished), int(total)):
        return
    try:
        _reporter.send(int(finished), int(total))
    except Exception as exc:  # progress is advisory: a missing gate must not stop generation
        _reporter.gate = None  # look it up again next time
        log.debug("rollmux: rollout progress not reported: %s", exc)


def _bracketed(call: Callable[[], Any], total: int) -> Any:
    """Await ``call()`` (one whole rollout of `total` responses), reporting 0 / total before, total / total after."""

    async def run() -> Any:
        if total > 0:
            report_progress(0, total)
        result = await call()
        if total > 0:
            report_progress(total, total)
        return result

    return run()


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The ``batch_size`` argument of a ``(data, batch_size)`` scheduler call (0 when absent)."""
    return int(kwargs.get("batch_size", args[1] if len(args) > 1 else 0) or 0)


def wrap_batch_rollout(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """``DynamicSamplingScheduler.get_batch_opt_level_0``: one batched generate; 0 / n, then n / n."""
    return _bracketed(lambda: wrapped(*args, **kwargs), _batch_size(args, kwargs))


class _ProgressBar:
    """A tqdm stand-in forwarding every ``update`` to the real bar and to the rollout gate."""

    def __init__(self, inner: Any, total: int) -> None:
        self._inner, self._total, self._done = inner, total, 0

    def update(self, n: int = 1) -> Any:
        self._done += int(n)
        report_progress(min(self._done, self._total), self._total)
        return self._inner.update(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def wrap_replay_get_batch(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    """``ReplayBuffer.get_batch(expected_samples, progress_bar)`` (the request path): per-response progress."""
    expected = int(kwargs.get("expected_samples", args[0] if args else 0) or 0)
    bar = kwargs.pop("progress_bar", args[1] if len(args) > 1 else None)
    rest = args[:1]
    return wrapped(*rest, progress_bar=_ProgressBar(bar, expected), **kwargs)


def wrap_agentic_batch(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """``RolloutScheduler._get_batch_impl(data, batch_size)`` of the train rollout: 0 / n, then n / n
    (validation and ``batch_size <= 0``, "run to the end", report nothing)."""
    train = getattr(instance, "mode", None) == "train"
    return _bracketed(lambda: wrapped(*args, **kwargs), _batch_size(args, kwargs) if train else 0)
