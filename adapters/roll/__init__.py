"""RollMux for unmodified ROLL (alibaba/ROLL) pipelines: ``pip install rollmux[roll]``, set
``ROLLMUX_SIDECAR_SOCKET``, run the job as usual. Unset, nothing about ROLL changes.

ROLL has no plugin entry point, so the package installs ``rollmux-roll.pth``: at interpreter start
it checks the opt-in variable and, only when it is set, imports :mod:`rollmux.adapters.roll.autoload`,
which calls :func:`patch`. Every target is wrapped when its ROLL module is imported (post-import
hooks), in the driver and in each Ray worker (the driver hands the variable to the workers in the
job's runtime environment). :func:`unpatch` restores every original.

Supported: ROLL 0.3.0 at the commits in :data:`SUPPORTED_COMMITS`. The version is guarded at the
first ROLL import, and ``run()``'s own source is checked to still open the spans the adapter gates.

Every ROLL worker that holds GPU memory (``Worker.__init__`` is wrapped) attaches as a rank of the job
on its own node's sidecar, and the driver's gates open and close each phase on every rank too
(``rollmux.adapters.common.ranks``): a multi-node job's permit guards each node it runs on.

Disaggregated jobs (actor_train and actor_infer on different devices) sync weights through
``rollmux.sync_plugin`` instead of ROLL's one-source broadcast, and load them on the inference side
under the Rollout permit (:mod:`.weight_sync`); their vLLM / SGLang engines release GPU memory
between rollouts as colocated ones do (:mod:`.workers`).

An RLVR or agentic job honours a relocation directive through ROLL's own checkpoint and resume
(``do_checkpoint`` is wrapped; :mod:`.relocation`): it checkpoints at a step's end (an agentic job's
rollout schedulers' position too, :mod:`.rollout_state`), acknowledges after the next ``model_update``
(Sync), and exits 75 for a restart on its new nodes.
"""

from __future__ import annotations

from rollmux.adapters.common.api import PatchTarget
from rollmux.adapters.common.patching import Patcher
from rollmux.adapters.roll import driver, rollout_state, weight_sync, workers
from rollmux.adapters.roll.driver import permit_log, progress_log

SUPPORTED_COMMITS = ("8eb27cc2",)
"""alibaba/ROLL commits this adapter was tested against (span names and method names are pinned)."""

SUPPORTED_VERSIONS = "==0.3.0"
"""The ``roll`` distribution versions accepted (ROLL's setup.py version at those commits)."""

_RLVR = "roll.pipeline.rlvr.rlvr_pipeline"
_AGENTIC = "roll.pipeline.agentic.agentic_pipeline"
_SCHED = "roll.distributed.scheduler.generate_scheduler"
_MUG = "roll.distributed.executor.model_update_group"
_WORKER = "roll.pipeline.base_worker"
_ROLLOUT = "roll.distributed.scheduler.rollout_scheduler"

TARGETS = (
    PatchTarget(module="roll.distributed.scheduler.initialize", attribute="init", wrapper=driver.wrap_init),
    PatchTarget(module=_RLVR, attribute="RLVRPipeline.__init__", wrapper=driver.wrap_pipeline_init),
    PatchTarget(module=_RLVR, attribute="RLVRPipeline.run", wrapper=driver.wrap_run),
    PatchTarget(module=_RLVR, attribute="get_tracer", wrapper=driver.wrap_get_tracer),
    PatchTarget(module="roll.pipeline.base_pipeline", attribute="BasePipeline.do_checkpoint",
                wrapper=driver.wrap_do_checkpoint),
    PatchTarget(module=_AGENTIC, attribute="AgenticPipeline.__init__", wrapper=driver.wrap_pipeline_init),
    PatchTarget(module=_AGENTIC, attribute="AgenticPipeline.run", wrapper=driver.wrap_run),
    PatchTarget(module=_AGENTIC, attribute="get_tracer", wrapper=driver.wrap_get_tracer),
    PatchTarget(module=_SCHED, attribute="DynamicSamplingScheduler.get_batch_opt_level_0",
                wrapper=workers.wrap_batch_rollout),
    PatchTarget(module=_SCHED, attribute="ReplayBuffer.get_batch", wrapper=workers.wrap_replay_get_batch),
    PatchTarget(module=_ROLLOUT, attribute="RolloutScheduler._get_batch_impl", wrapper=workers.wrap_agentic_batch),
    PatchTarget(module=_ROLLOUT, attribute="RolloutScheduler._run_rollout_loop",
                wrapper=rollout_state.wrap_rollout_loop),
    PatchTarget(module="roll.distributed.executor.worker", attribute="Worker.__init__",
                wrapper=workers.wrap_worker_init),
    PatchTarget(module="roll.distributed.strategy.vllm_strategy", attribute="VllmStrategy.offload_states",
                wrapper=workers.wrap_vllm_offload),
    PatchTarget(module="roll.distributed.strategy.sglang_strategy", attribute="SgLangStrategy.offload_states",
                wrapper=workers.wrap_sglang_offload),
    PatchTarget(module=_WORKER, attribute="InferWorker.load_states", wrapper=weight_sync.wrap_infer_load),
    PatchTarget(module=_WORKER, attribute="InferWorker.process_weights_after_loading",
                wrapper=weight_sync.wrap_infer_finish),
    PatchTarget(module=_MUG, attribute="ModelUpdateGroup.__init__", wrapper=weight_sync.wrap_group_init),
    PatchTarget(module=_MUG, attribute="ModelUpdateGroup.model_update", wrapper=weight_sync.wrap_group_model_update),
)

PATCHER = Patcher(adapter="roll", distribution="roll", supported=SUPPORTED_VERSIONS, targets=TARGETS,
                  remedy=driver.REMEDY)


__all__ = ["PATCHER", "SUPPORTED_COMMITS", "SUPPORTED_VERSIONS", "TARGETS", "applied", "patch", "permit_log",
           "progress_log", "unpatch"]


def patch() -> bool:
    """Install the ROLL hooks (idempotent). Returns False when already installed.

    Raises:
        AdapterError: ROLL is missing or its version is unsupported.
    """
    return PATCHER.patch()


def unpatch() -> None:
    """Restore every ROLL original and drop the pending hooks (idempotent)."""
    PATCHER.unpatch()


def applied() -> tuple[str, ...]:
    """``module:attribute`` of every ROLL target wrapped in this process right now."""
    return PATCHER.applied()
