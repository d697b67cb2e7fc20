"""Test stand-in for a GPU: small patches that let the real ROLL pipelines run on a CPU-only box.

Not part of RollMux. ROLL assumes an accelerator in a few places (see
shared/reference/roll_cpu_harness.md, section 4); this module patches exactly those, lazily, when
the ROLL module in question is imported, in the driver and in every Ray worker (``sitecustomize.py``
next to this file imports it; the harness puts this folder on the workers' ``PYTHONPATH``).

* CpuPlatform: pretend to be one Ray "GPU" (two with ``RMX_FAKE_GPUS=2``, so a job can put actor_train
  and actor_infer on different devices) so ROLL's ResourceManager and device mappings work,
  and give the accelerator calls torch.cpu lacks harmless CPU answers.
* ``DataProto.to("cuda")`` stays on the CPU; CUDA-IPC device-uuid rewriting skips CPU tensors;
  tensors cross processes through the file-system sharing strategy; HF models reload with ``.to``.
* :class:`CpuInferWorker`: ROLL's InferWorker awaits its strategy; hf_infer is synchronous.

One patch is not about the CPU: :func:`_patch_ports` keeps several ROLL jobs on one host from
picking the same port (``RMX_PORT_BLOCK``, set by the harness per job).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import os
import random
import socket
import sys
from collections.abc import Callable
from typing import Any

_HOOKS: dict[str, Callable[[Any], None]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, hook: Callable[[Any], None]) -> None:
        self.inner, self.hook = inner, hook

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        self.hook(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, hook)
        return spec


def _zero(*_a: Any, **_k: Any) -> int:
    return 0


def _none(*_a: Any, **_k: Any) -> None:
    return None


def fake_gpus() -> int:
    """Ray "GPUs" this host pretends to have (``RMX_FAKE_GPUS``, default 1; 2 for a disaggregated job)."""
    return int(os.environ.get("RMX_FAKE_GPUS", "1"))


def _patch_platform(mod: Any) -> None:
    import torch

    cls = mod.CpuPlatform
    cls.ray_device_key = "GPU"
    cls.device_control_env_var = "CUDA_VISIBLE_DEVICES"
    cls.ray_experimental_noset = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
    for name in ("empty_cache", "init", "reset_max_memory_allocated", "reset_peak_memory_stats",
                 "reset_max_memory_cached", "set_rng_state"):
        setattr(cls, name, staticmethod(_none))
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
                 "device_memory_used"):
        setattr(cls, name, staticmethod(_zero))
    cls.mem_get_info = staticmethod(lambda *a, **k: (0, 0))
    cls.device_count = staticmethod(fake_gpus)
    cls.get_rng_state = staticmethod(lambda *a, **k: torch.random.get_rng_state())

    class _Random:
        get_rng_state_all = staticmethod(lambda: [])
        set_rng_state_all = staticmethod(_none)

    cls.random = _Random


def _patch_protocol(mod: Any) -> None:
    original = mod.DataProto.to

    def to(self: Any, device: Any) -> Any:
        return original(self, "cpu" if str(device).startswith("cuda") else device)

    mod.DataProto.to = to


def _patch_send_recv(mod: Any) -> None:
    original = mod._modify_tuple

    def modify(t: tuple, index: int, modifier: Callable[[Any], Any]) -> tuple:
        if len(t) <= index or not isinstance(t[index], (int, str)):
            return t  # a CPU tensor's reduce tuple has no CUDA device index
        return original(t, index, modifier)

    mod._modify_tuple = modify


def _patch_ipc(mod: Any) -> None:
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")


def _load_to_cpu(model: Any) -> None:
    model.to("cpu")


def _patch_load_hf(mod: Any) -> None:
    mod.load_hf_model = _load_to_cpu


PORT_BLOCK_BASE, PORT_BLOCK_SIZE, PORT_BLOCKS = 20_000, 500, 20
"""Job i (``RMX_PORT_BLOCK``) picks ports in [20000 + 500 i, +500): above Ray's worker ports (10002-19999),
below the kernel's ephemeral range (32768 on), so no other process is handed one meanwhile."""


def _patch_ports(mod: Any) -> None:
    """ROLL picks a port by binding port 0 and letting it go (``collect_free_port``), unique only within
    one Ray instance (``Worker.get_free_port`` checks its SharedStorage). Several ROLL jobs on one host
    can then pick the same one, or one the kernel hands another process before ROLL binds it (seen:
    EADDRINUSE on an actor's MASTER_PORT while four jobs started at once)."""
    block = os.environ.get("RMX_PORT_BLOCK", "")
    if not block:
        return
    low = PORT_BLOCK_BASE + PORT_BLOCK_SIZE * (int(block) % PORT_BLOCKS)

    def collect_free_port() -> int:
        for port in random.sample(range(low, low + PORT_BLOCK_SIZE), PORT_BLOCK_SIZE):
            with socket.socket() as sock:
                try:
                    sock.bind(("", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in {low}-{low + PORT_BLOCK_SIZE - 1} (RMX_PORT_BLOCK={block})")

    mod.collect_free_port = collect_free_port


_HOOKS.update({
    "roll.utils.network_utils": _patch_ports,
    "roll.platforms.cpu": _patch_platform,
    "roll.distributed.scheduler.protocol": _patch_protocol,
    "roll.utils.send_recv_utils": _patch_send_recv,
    "roll.utils.cuda_ipc_utils": _patch_ipc,
    "roll.utils.offload_states": _patch_load_hf,
    "roll.distributed.strategy.hf_strategy": _patch_load_hf,
    "roll.distributed.strategy.mock_strategy": _patch_load_hf,
})


def install() -> None:
    """Register the lazy patches (idempotent); modules already imported are patched at once."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name, hook in _HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])


# --------------------------------------------------------------------------------- infer worker

_AWAITED = frozenset({"initialize", "offload_states", "load_states", "generate", "generate_request",
                      "broadcast_parameter", "setup_collective_group", "update_parameter_in_bucket",
                      "add_lora", "process_weights_after_loading", "abort_requests"})


class _AsyncStrategy:
    """Presents a synchronous strategy with the awaitable methods ROLL's InferWorker expects."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "abort_requests" and not hasattr(self._inner, name):
            return _async(_none)
        attr = getattr(self._inner, name)
        return _async(attr) if name in _AWAITED and callable(attr) else attr


def _async(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    return call


def _infer_worker_cls() -> type:
    from roll.distributed.executor.worker import Worker
    from roll.distributed.scheduler.decorator import Dispatch, register
    from roll.distributed.strategy.factory import create_strategy
    from roll.models.model_providers import default_actor_model_provider
    from roll.pipeline.base_worker import InferWorker
    from roll.platforms import current_platform

    class CpuInferWorker(InferWorker):
        """InferWorker whose synchronous hf_infer strategy is wrapped to be awaitable."""

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        async def initialize(self, pipeline_config: Any) -> None:
            Worker.initialize(self, pipeline_config)
            self.strategy = _AsyncStrategy(create_strategy(worker=self))
            await self.strategy.initialize(model_provider=default_actor_model_provider)
            self.tokenizer = self.strategy.tokenizer
            await self.strategy.offload_states()
            current_platform.init()

    CpuInferWorker.__module__ = __name__
    CpuInferWorker.__qualname__ = "CpuInferWorker"
    return CpuInferWorker


def __getattr__(name: str) -> Any:
    if name == "CpuInferWorker":  # built on first use: importing ROLL here eagerly would slow every process
        cls = _infer_worker_cls()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
