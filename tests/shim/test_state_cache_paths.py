"""The state cache's GPU-facing paths, on CPU where torch allows it: FSDP2 ``DTensor`` state (one-rank
gloo world), fused and capturable Adam, a failed copy that waits for the copies already issued before
any storage is freed, a CPU cache that never probes CUDA, and the host reservation at registration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from rollmux.core.ports import free_port
from rollmux.shim.state_cache import CacheState, StateCache, StateCacheConfig

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

SMALL = StateCacheConfig(chunk_bytes=4096, alignment=64)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _bytes(t: Any) -> bytes:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone().numpy().tobytes()


def _state(model: Any, opt: Any) -> dict[str, bytes]:
    out = {f"p.{k}": _bytes(p) for k, p in model.named_parameters()}
    out.update({f"g.{k}": _bytes(p.grad) for k, p in model.named_parameters() if p.grad is not None})
    for i, st in enumerate(opt.state.values()):
        out.update({f"o.{i}.{k}": _bytes(v) for k, v in st.items()})
    return out


# ------------------------------------------------------------------------------------ FSDP2 DTensor


@pytest.fixture(scope="module")
def gloo_world() -> Iterator[None]:
    """A one-rank process group, as FSDP2 needs one: gloo for CPU tensors (and NCCL for CUDA ones)."""
    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fsdp2(device: str) -> tuple[Any, Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.ReLU(), torch.nn.Linear(65, 7)).to(device)
    fully_shard(model, mesh=init_device_mesh(device, (1,)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(5, 33, device=device)
    return model, opt, x


def _step(model: Any, opt: Any, x: Any) -> None:
    model(x).square().sum().backward()
    opt.step()


def test_fsdp2_dtensor_state_round_trips_bitwise_and_trains_on(gloo_world: None) -> None:
    from torch.distributed.tensor import DTensor

    model, opt, x = _fsdp2("cpu")
    twin, twin_opt, _ = _fsdp2("cpu")
    _step(model, opt, x)
    _step(twin, twin_opt, x)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert any(isinstance(v, DTensor) for st in opt.state.values() for v in st.values())
    cache = StateCache("fsdp2", config=SMALL)
    cache.register_module("policy", model)
    cache.register_optimizer("adam", opt)
    before = _state(model, opt)
    resident = cache.device_bytes()
    shards = sum(p.to_local().untyped_storage().nbytes() for p in model.parameters())
    assert resident >= 4 * shards  # parameters, gradients and both Adam moments, each a local shard
    stats = cache.offload()
    assert stats.nbytes == resident and cache.device_bytes() == 0
    assert all(p.to_local().untyped_storage().nbytes() == 0 for p in model.parameters())
    cache.reload()
    assert _state(model, opt) == before
    for _ in range(2):  # the cached model keeps training exactly like its twin that was never offloaded
        cache.offload()
        cache.reload()
        _step(model, opt, x)
        _step(twin, twin_opt, x)
    assert _state(model, opt) == _state(twin, twin_opt)


@pytest.mark.gpu
@needs_cuda
def test_fsdp2_dtensor_state_on_gpu_frees_its_memory(gloo_world: None) -> None:
    model, opt, x = _fsdp2("cuda")
    _step(model, opt, x)
    cache = StateCache("fsdp2")
    cache.register_module("policy", model)
    cache.register_optimizer("adam", opt)
    before = _state(model, opt)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    stats = cache.offload()
    assert torch.cuda.memory_allocated() <= allocated - stats.nbytes
    cache.reload()
    assert _state(model, opt) == before


# ----------------------------------------------------------------------------- fused and capturable Adam


def _adam_pair(device: str, **kw: Any) -> tuple[list[Any], list[Any], Any]:
    pairs = []
    for _ in range(2):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(17, 31), torch.nn.Linear(31, 3)).to(device)
        pairs.append((model, torch.optim.Adam(model.parameters(), lr=1e-2, **kw)))
    x = torch.randn(4, 17, device=device)
    return pairs[0], pairs[1], x


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])])
@pytest.mark.parametrize("kind", ["fused", "capturable", "foreach"])
def test_adam_variants_round_trip_and_train_like_an_uncached_twin(device: str, kind: str) -> None:
    if kind == "capturable" and device == "cpu":
        pytest.skip("torch refuses capturable Adam on CPU tensors (CUDA, XPU, HPU and XLA only)")
    (model, opt), (twin, twin_opt), x = _adam_pair(device, **{kind: True})
    cache = StateCache(f"adam-{kind}", config=SMALL if device == "cpu" else StateCacheConfig())
    cache.register_module("m", model)
    cache.register_optimizer("adam", opt)
    for _ in range(3):
        _step(model, opt, x)
        _step(twin, twin_opt, x)
        before = _state(model, opt)
        cache.offload()
        assert cache.device_bytes() == 0
        if kind == "capturable":  # its step counters live on the GPU, so they are cached and freed too
            assert all(st["step"].untyped_storage().nbytes() == 0 for st in opt.state.values())
        cache.reload()
        assert _state(model, opt) == before
    assert _state(model, opt) == _state(twin, twin_opt)


# ------------------------------------------------------------------- rollback waits for issued copies


class DeferredEngine:
    """Copies that are still running when ``submit`` returns, as CUDA's non-blocking copies are; one of
    them can fail at issue. A copy that runs after its storage was freed is recorded, not performed."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.pending: list[tuple[Any, Any]] = []
        self.into_freed = 0
        self.waits = 0

    def begin(self) -> None:
        pass

    def submit(self, index: int, dst: Any, src: Any) -> None:
        if index == self.fail_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        self.pending.append((dst, src))

    def wait(self) -> None:
        self.waits += 1
        for dst, src in self.pending:
            if dst.untyped_storage().nbytes() == 0 or src.untyped_storage().nbytes() == 0:
                self.into_freed += 1
            else:
                dst.copy_(src)
        self.pending = []


def _tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {f"t{i}": torch.randn(1000 + 77 * i, generator=g) for i in range(4)}


def test_failed_reload_waits_for_issued_copies_before_freeing() -> None:
    tensors = _tensors()
    expected = {k: v.clone() for k, v in tensors.items()}
    engine = DeferredEngine()
    cache = StateCache("job", config=SMALL, engine=engine)
    for k, v in tensors.items():
        cache.register_tensor(k, v)
    cache.offload()
    engine.fail_at = 5  # segments 0-4 were issued and still run when segment 5 fails
    with pytest.raises(RuntimeError, match="injected"):
        cache.reload()
    assert engine.pending == [] and engine.into_freed == 0
    assert cache.state is CacheState.OFFLOADED and cache.device_bytes() == 0
    engine.fail_at = None
    cache.reload()  # the host copy was intact: a retry brings the state back
    assert all(torch.equal(tensors[k], expected[k]) for k in tensors)


def test_failed_offload_waits_for_issued_copies_before_the_phase_resumes() -> None:
    tensors = _tensors()
    engine = DeferredEngine(fail_at=3)
    cache = StateCache("job", config=SMALL, engine=engine)
    for k, v in tensors.items():
        cache.register_tensor(k, v)
    with pytest.raises(RuntimeError, match="injected"):
        cache.offload()
    assert engine.pending == [] and cache.state is CacheState.RESIDENT
    engine.fail_at = None
    before = {k: v.clone() for k, v in tensors.items()}
    cache.offload()
    cache.reload()
    assert all(torch.equal(tensors[k], before[k]) for k in tensors)


# --------------------------------------------------------------------------- a CPU cache never asks CUDA


@pytest.mark.parametrize("device", ["cpu", None])
def test_cpu_cache_never_calls_cuda_is_available(monkeypatch: pytest.MonkeyPatch, device: str | None) -> None:
    def probe() -> bool:
        raise AssertionError("a CPU cache called torch.cuda.is_available() (cuInit)")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    model = torch.nn.Linear(64, 64)
    cache = StateCache("cpu", device=device, config=SMALL)
    cache.register_module("m", model)
    cache.reserve(cache.expected_bytes())
    assert not cache.pinned
    weight = model.weight.detach().clone()
    cache.offload()
    cache.reload()
    assert torch.equal(model.weight, weight)


# ------------------------------------------------------------------------- reservation at registration


@pytest.mark.parametrize("kw", [{}, {"amsgrad": True}, {"fused": True}])
def test_expected_bytes_covers_the_first_offload_with_adam_state(kw: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(100, 300), torch.nn.Linear(300, 10))
    opt = torch.optim.Adam(model.parameters(), **kw)
    cache = StateCache("job", config=StateCacheConfig(chunk_bytes=64 << 10, alignment=512))
    cache.register_module("m", model)
    cache.register_optimizer("adam", opt)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    expected = cache.expected_bytes()
    slots = 3 if kw.get("amsgrad") else 2  # weights, gradients and the Adam moments
    assert (2 + slots) * params <= expected <= (2 + slots) * params + 512 * 20
    cache.reserve(expected)
    allocations = cache.host_allocations
    _step(model, opt, torch.randn(2, 100))
    cache.offload()  # parameters, gradients and the Adam state that appeared at the step: nothing allocated now
    assert cache.host_allocations == allocations
    cache.reload()
