"""Tests of the warm-start state cache (CPU path; the GPU path is marked ``gpu``)."""

from __future__ import annotations

import pytest

from rollmux.core.errors import RollMuxError
from rollmux.shim.state_cache import (
    TRANSITIONS,
    CacheState,
    CacheTransitionError,
    RegistrationError,
    StateCache,
    StateCacheConfig,
    StateCacheError,
    TensorPlacement,
    canonical_device,
    choose_device,
    plan_segments,
)

torch = pytest.importorskip("torch")

SMALL = StateCacheConfig(chunk_bytes=4096, alignment=64)
"""Chunks far smaller than the tensors, so tensors span chunks and segments split."""

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _mixed_tensors(device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(DTYPES):
        n = 257 + 1000 * i  # odd sizes: not aligned to anything
        if dtype.is_floating_point:
            t = torch.randn(n, generator=gen).to(dtype)
        elif dtype is torch.bool:
            t = torch.rand(n, generator=gen) > 0.5
        else:
            t = torch.randint(-100 if dtype.is_signed else 0, 100, (n,), generator=gen).to(dtype)
        out[str(dtype)] = t.to(device)
    out["nan_inf"] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-45], device=device)
    return out


def _snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {
        k: v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone().numpy().tobytes()
        for k, v in tensors.items()
    }


def _model_and_adam() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.LayerNorm(65), torch.nn.Linear(65, 7))
    model[2].to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(5, 33)
    model[2](model[1](model[0](x)).bfloat16()).float().sum().backward()
    opt.step()
    return model, opt


def _all_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"p.{k}": v for k, v in model.state_dict().items()}
    out.update({f"g.{k}": p.grad for k, p in model.named_parameters()})
    for i, st in enumerate(opt.state.values()):
        out.update({f"o.{i}.{k}": v for k, v in st.items()})
    return out


def test_plan_segments_split_at_chunk_boundaries() -> None:
    segments, total = plan_segments([10, 100, 3], chunk_bytes=64, alignment=16)
    assert total == 16 + 112 + 3 - 0  # 10 -> pad to 16; 100 at 16..116 -> pad to 128; 3 at 128..131
    assert total == 131
    assert sum(s.nbytes for s in segments) == 113
    assert all(s.dst_offset + s.nbytes <= 64 for s in segments)
    assert [(s.entry, s.chunk) for s in segments] == [(0, 0), (1, 0), (1, 1), (2, 2)]


def test_mixed_dtypes_bitwise_identical_after_reload_and_memory_released() -> None:
    tensors = _mixed_tensors()
    before = _snapshot(tensors)
    cache = StateCache("job", config=SMALL)
    for name, t in tensors.items():
        cache.register_tensor(name, t)
    resident = cache.device_bytes()
    assert resident == sum(t.untyped_storage().nbytes() for t in tensors.values())

    stats = cache.offload()
    assert stats.nbytes == resident and stats.segments > len(tensors)
    assert cache.state is CacheState.OFFLOADED
    assert cache.device_bytes() == 0
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors.values())
    assert cache.host_bytes() >= resident

    cache.reload()
    assert cache.state is CacheState.RESIDENT
    assert cache.device_bytes() == resident
    assert _snapshot(tensors) == before


def test_module_and_adam_state_round_trip_and_training_continues() -> None:
    model, opt = _model_and_adam()
    twin, twin_opt = _model_and_adam()
    state = _all_state(model, opt)
    assert any(".exp_avg_sq" in k for k in state)
    before = _snapshot(state)

    cache = StateCache("job", config=SMALL)
    cache.register_module("policy", model)
    cache.register_optimizer("adam", opt)
    cache.offload()
    assert all(t.untyped_storage().nbytes() == 0 for t in state.values())
    cache.reload()
    assert _snapshot(state) == before

    # The same step on the cached model and on an untouched twin gives the same bytes.
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        m[2](m[1](m[0](torch.ones(2, 33))).bfloat16()).float().sum().backward()
        o.step()
    assert _snapshot(_all_state(model, opt)) == _snapshot(_all_state(twin, twin_opt))


def test_views_and_tied_weights_share_one_storage() -> None:
    base = torch.arange(100, dtype=torch.float32)
    view = base[10:20]
    emb = torch.nn.Embedding(10, 10)
    head = torch.nn.Linear(10, 10, bias=False)
    head.weight = emb.weight  # tied
    cache = StateCache("job", config=SMALL)
    cache.register_tensor("base", base)
    cache.register_tensor("view", view)
    cache.register_module("emb", emb)
    cache.register_module("head", head)
    stats = cache.offload()
    assert stats.nbytes == 400 + 400  # each storage once
    cache.reload()
    assert torch.equal(view, torch.arange(10, 20, dtype=torch.float32))
    assert head.weight is emb.weight and torch.equal(base[10:20], view)


def test_host_buffers_allocated_once_across_phases() -> None:
    tensors = _mixed_tensors()
    cache = StateCache("job", config=SMALL)
    for name, t in tensors.items():
        cache.register_tensor(name, t)
    cache.offload()
    allocations, host = cache.host_allocations, cache.host_bytes()
    for _ in range(5):
        cache.reload()
        cache.offload()
    assert (cache.host_allocations, cache.host_bytes()) == (allocations, host)
    cache.reload()
    cache.release()
    assert cache.host_bytes() == 0


def test_reserve_up_front_means_no_allocation_at_offload() -> None:
    t = torch.randn(10_000)
    cache = StateCache("job", config=SMALL)
    cache.register_tensor("t", t)
    cache.reserve(50_000)
    allocations = cache.host_allocations
    cache.offload()
    assert cache.host_allocations == allocations


def test_offload_and_reload_are_idempotent() -> None:
    t = torch.randn(1000)
    cache = StateCache("job", config=SMALL)
    cache.register_tensor("t", t)
    assert cache.reload().noop
    cache.offload()
    assert cache.offload().noop
    cache.reload()
    assert cache.reload().noop
    assert [(r.src.value, r.dst.value) for r in cache.history] == [
        ("resident", "offloading"),
        ("offloading", "offloaded"),
        ("offloaded", "loading"),
        ("loading", "resident"),
    ]


@pytest.mark.parametrize(
    ("src", "dst"),
    [(s, d) for s in CacheState for d in CacheState if d not in TRANSITIONS[s]],
    ids=lambda s: s.value,
)
def test_transition_refuses_every_illegal_edge(src: CacheState, dst: CacheState) -> None:
    cache = StateCache("job-x")
    path = {
        CacheState.RESIDENT: [],
        CacheState.OFFLOADING: [CacheState.OFFLOADING],
        CacheState.OFFLOADED: [CacheState.OFFLOADING, CacheState.OFFLOADED],
        CacheState.LOADING: [CacheState.OFFLOADING, CacheState.OFFLOADED, CacheState.LOADING],
    }[src]
    for step in path:
        cache.transition(step)
    with pytest.raises(CacheTransitionError, match="job-x.*illegal transition") as info:
        cache.transition(dst)
    assert isinstance(info.value, RollMuxError)
    assert cache.state is src and len(cache.history) == len(path)


def test_offload_while_loading_is_refused() -> None:
    cache = StateCache("job")
    cache.register_tensor("t", torch.ones(3))
    cache.offload()
    cache.transition(CacheState.LOADING)  # as if another thread were reloading
    with pytest.raises(CacheTransitionError):
        cache.offload()


def test_registration_only_while_resident_and_release_refused_when_offloaded() -> None:
    cache = StateCache("job")
    cache.register_tensor("t", torch.ones(3))
    with pytest.raises(RegistrationError, match="already registered"):
        cache.register_tensor("t", torch.ones(3))
    cache.offload()
    with pytest.raises(RegistrationError, match="reload"):
        cache.register_tensor("u", torch.ones(3))
    with pytest.raises(StateCacheError, match="only copy"):
        cache.release()


def test_failed_copy_rolls_back_to_resident_with_data_intact() -> None:
    np = pytest.importorskip("numpy")
    owned = torch.arange(10.0)
    external = torch.from_numpy(np.arange(5.0))  # external memory: storage cannot be resized
    cache = StateCache("job")
    cache.register_tensor("owned", owned)
    cache.register_tensor("external", external)
    with pytest.raises(RegistrationError, match="external memory"):
        cache.offload()
    assert cache.state is CacheState.RESIDENT
    assert cache.history[-1].detail.startswith("offload failed")
    assert torch.equal(owned, torch.arange(10.0))


@pytest.mark.parametrize(("given", "expected"), [
    ("cuda", "cuda:3"),  # no index: the current device's (3 here), as a tensor on it reports
    ("cuda:1", "cuda:1"),
    ("cpu", "cpu"),
    ("meta", "meta"),
], ids=["cuda-gets-current-index", "explicit-index-kept", "cpu", "meta"])
def test_canonical_device_names_the_index_tensors_report(given: str, expected: str) -> None:
    assert canonical_device(given, current_index=lambda kind: 3) == torch.device(expected)


def _placed(*items: tuple[str, str, bool]) -> list[TensorPlacement]:
    return [TensorPlacement(name=n, device=torch.device(d), scalar=s) for n, d, s in items]


@pytest.mark.parametrize(("placements", "expected"), [
    (_placed(("w", "cuda:0", False), ("adam.0.step", "cpu", True)), "cuda:0"),  # CPU Adam step beside GPU state
    (_placed(("w", "cuda:1", False), ("b", "cuda:1", True)), "cuda:1"),
    (_placed(("w", "cpu", False), ("adam.0.step", "cpu", True)), "cpu"),
    (_placed(), "cpu"),
], ids=["gpu-module-cpu-adam-step", "one-gpu", "cpu-only", "nothing-registered"])
def test_choose_device_leaves_cpu_optimizer_scalars_beside_gpu_state(placements, expected) -> None:
    assert choose_device(placements) == torch.device(expected)


@pytest.mark.parametrize("placements", [
    _placed(("w", "cuda:0", False), ("v", "cuda:1", False)),
    _placed(("w", "cuda:0", False), ("host_copy", "cpu", False)),
], ids=["two-gpus", "gpu-and-cpu-tensor"])
def test_choose_device_refuses_ambiguous_state(placements) -> None:
    with pytest.raises(RegistrationError, match="several devices"):
        choose_device(placements, owner="job 'j'")


def test_cpu_cache_without_device_still_caches_adam_step() -> None:
    model, opt = _model_and_adam()
    cache = StateCache("job")
    cache.register_module("m", model)
    cache.register_optimizer("adam", opt)
    steps = [st["step"] for st in opt.state.values()]
    cache.offload()
    assert all(s.untyped_storage().nbytes() == 0 for s in steps)  # on CPU the step is state like any other
    cache.reload()
    assert all(float(s) == 1.0 for s in steps)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_gpu_cache_built_with_bare_cuda_frees_the_modules_memory() -> None:
    model = torch.nn.Linear(1024, 1024).to("cuda:0")
    cache = StateCache("job", device="cuda")  # no index, as benchmarks/state_cache.py passes it
    cache.register_module("m", model)
    before = cache.device_bytes()
    assert before >= 1024 * 1024 * 4
    stats = cache.offload()
    assert stats.nbytes == before and cache.device_bytes() == 0
    cache.reload()


@pytest.mark.gpu
@needs_cuda
def test_gpu_module_with_adam_offloads_after_a_step_without_device() -> None:
    model = torch.nn.Linear(256, 256).to("cuda")
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256, device="cuda")).sum().backward()
    opt.step()
    assert all(st["step"].device.type == "cpu" for st in opt.state.values())
    cache = StateCache("job")  # as the shim builds it
    cache.register_module("m", model)
    cache.register_optimizer("adam", opt)
    weight = model.weight.detach().clone()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    cache.offload()
    assert torch.cuda.memory_allocated() < allocated
    cache.reload()
    assert torch.equal(model.weight, weight)
    opt.step()  # the CPU step counters were left in place and still work


@pytest.mark.gpu
@needs_cuda
def test_gpu_round_trip_frees_device_memory_and_pins() -> None:
    tensors = _mixed_tensors("cuda")
    big = torch.randn(64 << 20, device="cuda")  # 256 MiB
    tensors["big"] = big
    before = _snapshot(tensors)
    cache = StateCache("job", config=StateCacheConfig(chunk_bytes=16 << 20))
    for name, t in tensors.items():
        cache.register_tensor(name, t)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    cache.offload()
    assert cache.pinned and cache.host_bytes() >= big.numel() * 4
    assert torch.cuda.memory_allocated() <= allocated - big.numel() * 4
    cache.reload()
    assert _snapshot(tensors) == before
