"""CPU stand-ins that let the real veRL 0.9.1 trainer run on a machine without a GPU (test harness).

Loaded in every veRL process through ``VERL_USE_EXTERNAL_MODULES=rollmux_verl_cpu`` (this folder on
``PYTHONPATH``), selected with ``VERL_PLATFORM=cpu`` and ``actor_rollout_ref.rollout.name=hf_cpu``.
What stands in for a GPU, and nothing more:

* a CPU platform (device "cpu", gloo), registered in veRL's ``PlatformRegistry``;
* veRL's own FSDP2 engines registered for device "cpu" (veRL registers them for cuda/npu only);
* ``hf_cpu``: a small rollout replica whose server actor generates with HF ``generate`` and returns
  per-token log-probs (stands in for vLLM / SGLang); greedy when ``top_k == 1``;
* three CUDA-isms worked around: the duplicated "cpu:gloo" process-group backend, the forced
  ``pin_memory`` of FSDP2's CPU offload policy, and flash-attention in the value-head loader.

The events this module sees (server init / sleep / wake / load_weights and the workers' weight push, with
pid and, on the multi-node cluster of ``tests/multinode``, the node label) go to the JSON-lines file named
by ``RMX_HARNESS_EVENTS`` when set, for the tests' process checks. The ``hf_cpu`` server is a GPU process
of the job: it attaches as a rank on its node's sidecar, as the adapter makes veRL's vLLM server one. With ``RMX_START_FILE`` set,
the trainer records a ``start_gate`` event before its first phase (the legacy trainer at ``fit()``, the v1
trainer before its initial weight push) and waits for that file, so that the tests can start several
jobs' first phases together (test control, not a GPU stand-in). Two more test controls,
for ``benchmarks/verl_cpu.py``, the same in unset and opted-in jobs: with ``RMX_STEP_GATE`` (a folder)
the driver pauses after each step until the benchmark lets it go on (:func:`_step_gate`); with
``RMX_REPLAY_POLL_S`` the v1 ``ReplayBuffer`` polls for finished rollouts every that many seconds
instead of veRL's 2.0. Two more for the multi-node tests, always on: each FSDP rank records the samples it
trains on (``train.batch`` events, :func:`_batch_log`), and a training batch keeps its prompts' dataloader
order rather than the order their rollouts finished (:func:`_batch_order`; ``RMX_COMPLETION_ORDER=1`` in the
job's environment restores veRL's order).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import types
from typing import Any

import torch

EVENTS = "RMX_HARNESS_EVENTS"
START_FILE = "RMX_START_FILE"
STEP_GATE = "RMX_STEP_GATE"
REPLAY_POLL_S = "RMX_REPLAY_POLL_S"
COMPLETION_ORDER = "RMX_COMPLETION_ORDER"
START_WAIT_S = 900.0


def event(kind: str, **fields: Any) -> None:
    path = os.environ.get(EVENTS)
    if not path:
        return
    rec = {"kind": kind, "pid": os.getpid(), "t": time.time(), **fields}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


NODE_LABEL = "rollmux.sim/node"
"""The Ray node label naming a simulated node (tests/multinode: one raylet per node on this host)."""


def node_label() -> str:
    """This process's Ray node as its ``rollmux.sim/node`` label ("" outside a labelled cluster)."""
    import ray

    if not ray.is_initialized():
        return ""
    return str((ray.get_runtime_context().get_node_labels() or {}).get(NODE_LABEL, ""))


# ------------------------------------------------------------------------------------------ platform
class _CpuDeviceModule(types.SimpleNamespace):
    """What veRL calls on ``torch.cuda`` (via ``get_torch_device()``), answered for the CPU."""

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    stream = staticmethod(torch.cpu.stream)
    current_stream = staticmethod(torch.cpu.current_stream)
    synchronize = staticmethod(torch.cpu.synchronize)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(_device: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(*_args: Any, **_kwargs: Any) -> None:
        return None

    @staticmethod
    def mem_get_info(*_args: Any) -> tuple[int, int]:
        return (16 << 30, 16 << 30)

    @staticmethod
    def memory_allocated(*_args: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def get_device_name(*_args: Any) -> str:
        return "CPU"  # utils/flops_counter.py tests `"H100" in name`


def _register_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _CpuDeviceModule()

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"  # so `.to(get_device_id())` moves to the CPU

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):  # type: ignore[no-untyped-def]
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # one logical Ray GPU per node (+ray_kwargs.ray_init.num_gpus=1)

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


# ------------------------------------------------------------------------------------------- engine
def _register_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as ti

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
        ti.FSDPEngineWithLMHead)
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(
        ti.FSDPEngineWithValueHead)

    class _UnpinnedOffload(ti.CPUOffloadPolicy):  # FSDP2 pins host memory, which needs an accelerator
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["pin_memory"] = False
            super().__init__(*args, **kwargs)

    ti.CPUOffloadPolicy = _UnpinnedOffload


def _gloo_process_group() -> None:
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray

    def init_gloo(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend="gloo")

    import verl.checkpoint_engine.base as ceb
    import verl.workers.engine_workers as ew

    for mod in (distributed, ew, ceb):
        mod.initialize_global_process_group_ray = init_gloo


def _eager_valuehead() -> None:
    from verl.utils import model as vmodel

    def load_valuehead_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(local_path, torch_dtype=torch_dtype, config=model_config,
                                                               attn_implementation="eager",
                                                               trust_remote_code=trust_remote_code)

    vmodel.load_valuehead_model = load_valuehead_model


# ------------------------------------------------------------------------------------------ rollout
def _register_rollout() -> None:
    from verl.workers.rollout import base as rbase
    from verl.workers.rollout import replica as rrep

    rbase._ROLLOUT_REGISTRY[("hf_cpu", "async")] = "rollmux_verl_cpu_rollout.HFCPUServerAdapter"
    rrep.RolloutReplicaRegistry.register("hf_cpu", _replica_class)


def _replica_class() -> type:
    from rollmux_verl_cpu_rollout import HFCPUReplica

    return HFCPUReplica


# ------------------------------------------------------------------------------------ test controls
def _replace(module_name: str, cls_name: str, attr: str, wrap: Any) -> None:
    """Once `module_name` is imported, replace ``cls.attr`` by ``wrap(original)`` (once: a re-imported module
    runs its hook again). Installed as post-import hooks: this module loads while veRL is half-imported."""
    from rollmux.adapters.common.hooks import when_imported

    def hook(module: Any) -> None:
        cls = getattr(module, cls_name)
        original = cls.__dict__[attr]
        if getattr(original, "_rmx_harness", False):
            return
        new = functools.wraps(original)(wrap(original))
        new._rmx_harness = True
        setattr(cls, attr, new)

    when_imported(module_name, hook)


def _wait_start(path: str, trainer: str) -> None:
    """Record a ``start_gate`` event and wait until `path` exists (at most ``START_WAIT_S``)."""
    event("start_gate", trainer=trainer)
    deadline = time.monotonic() + START_WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)


def _start_gate() -> None:
    """Hold each trainer before its first phase until the file named by ``RMX_START_FILE`` exists (if set).

    The gate must come before the job's first permit: a job waiting there while it holds a node would
    keep every other job of its node from reaching the gate (each waits for the node), and the gate,
    waiting for them all, would never open. The legacy ``RayPPOTrainer`` asks for nothing before
    ``fit()`` (the adapter's own ``fit`` patch, installed later, wraps this one), so it waits there. The
    v1 ``PPOTrainer`` pushes its initial weights at the end of ``init()`` (``on_init_end``: the sync
    trainer's ``update_weights``, which opens Rollout(0)), so it waits right before that push, once its
    workers and servers are built."""
    path = os.environ.get(START_FILE)
    if not path:
        return

    def gated_fit(fit: Any) -> Any:
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            _wait_start(path, "RayPPOTrainer")
            return fit(self, *args, **kwargs)

        return wrapped

    def gated_init(init: Any) -> Any:
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            push = self.on_init_end  # the trainer mode's own hook (an instance attribute shadows it for init)

            def gated_push() -> Any:
                _wait_start(path, "PPOTrainer")
                return push()

            self.on_init_end = gated_push
            try:
                return init(self, *args, **kwargs)
            finally:
                del self.on_init_end

        return wrapped

    _replace("verl.trainer.ppo.ray_trainer", "RayPPOTrainer", "fit", gated_fit)
    _replace("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "init", gated_init)


def _step_gate() -> None:
    """With ``RMX_STEP_GATE`` set to a folder: once the trainer has logged step k's metrics (``Tracking.log``,
    after veRL's ``step`` timer has stopped and every phase of the step has ended), write ``done-k`` there
    (holding the time) and wait for ``go-{k+1}``. The pause falls between two steps, outside veRL's
    ``timing_s/step``; it lets a benchmark run two jobs one step at a time in turn. A step logged twice
    pauses once."""
    folder = os.environ.get(STEP_GATE)
    if not folder:
        return

    def wrap(log: Any) -> Any:
        def gated_log(self: Any, data: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
            result = log(self, data, step, *args, **kwargs)
            done = os.path.join(folder, f"done-{step}")
            if not os.path.exists(done):
                with open(done, "w") as f:
                    f.write(str(time.time()))
                go, deadline = os.path.join(folder, f"go-{int(step) + 1}"), time.monotonic() + START_WAIT_S
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            return result

        return gated_log

    _replace("verl.utils.tracking", "Tracking", "log", wrap)


def _replay_poll() -> None:
    """With ``RMX_REPLAY_POLL_S`` set: every v1 ``ReplayBuffer`` polls at that interval (seconds)."""
    raw = os.environ.get(REPLAY_POLL_S)
    if not raw:
        return

    def wrap(init: Any) -> Any:
        def init_polling(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self.poll_interval = float(raw)

        return init_polling

    _replace("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer", "__init__", wrap)


def _batch_log() -> None:
    """With ``RMX_HARNESS_EVENTS`` set: each FSDP rank records the samples it trains on, in order (a short hash
    of each row's token ids, its data-parallel rank and node), so that tests can compare two runs' per-rank
    batches."""
    if not os.environ.get(EVENTS):
        return

    def wrap(train_mini_batch: Any) -> Any:
        def logged(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
            if "input_ids" in data:
                ids = data["input_ids"]
                rows = ids.unbind(0) if ids.is_nested else list(ids)
                event("train.batch", node=node_label(), rank=int(self.engine.get_data_parallel_rank()),
                      rows=[row_digest(r) for r in rows])
            return train_mini_batch(self, data, *args, **kwargs)

        return logged

    _replace("verl.workers.engine_workers", "TrainingWorker", "train_mini_batch", wrap)


def row_digest(row: torch.Tensor) -> str:
    """A short, stable name for one sample: the hash of its token ids."""
    import hashlib

    return hashlib.sha1(row.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:10]


def _batch_order() -> None:
    """A training batch in the order its prompts came from the dataloader, not the order their rollouts
    finished. veRL's v1 ``ReplayBuffer`` lists a batch's trajectories in the order TransferQueue received them;
    with two rollout replicas that order varies run to run, and so does which FSDP rank trains on which
    sample (test control: with it, two runs of a job train on the same per-rank batches)."""
    if os.environ.get(COMPLETION_ORDER):  # veRL's own order, to show the difference
        return

    def wrap(materialize: Any) -> Any:
        def in_prompt_order(self: Any, partition_id: str, selected: list[str], snapshot: dict[str, dict]) -> Any:
            prompts = {uid: i for i, uid in enumerate(self.prompt_global_steps[partition_id])}

            def position(key: str) -> tuple[int, ...]:
                uid, session, index = key.rsplit("_", 2)  # {uid}_{session_id}_{index}
                return prompts.get(uid, len(prompts)), int(session), int(index)

            return materialize(self, partition_id, selected, dict(sorted(snapshot.items(), key=lambda kv: position(kv[0]))))

        return in_prompt_order

    _replace("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer", "_materialize_batch", wrap)


_done = False


def install() -> None:
    """Register everything once per process (veRL imports this module from ``verl/__init__``)."""
    global _done
    if _done:
        return
    _done = True
    _register_platform()
    _register_engines()
    _gloo_process_group()
    _eager_valuehead()
    _register_rollout()
    _start_gate()
    _step_gate()
    _replay_poll()
    _batch_log()
    _batch_order()


install()
