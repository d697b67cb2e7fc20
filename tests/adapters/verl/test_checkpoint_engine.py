"""The ``rollmux`` checkpoint-engine backend against the real veRL 0.9.1 on CPU: real Ray actors,
real gloo, veRL's own ``CheckpointEngineManager`` and ``CheckpointEngineWorker`` drive it.

Trainers are a stand-in for ``ActorRolloutRefWorker`` (same engine construction and
``update_weights``; FSDP2-style ``Shard(0)`` DTensors over a gloo mesh of their own default group
instead of a model); the rollout side is veRL's ``CheckpointEngineWorker`` with a recording server
adapter standing in for vLLM/SGLang, which need a GPU. Replicas are a stand-in exposing the
coroutines the manager awaits around the transfer.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("verl")

import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh  # noqa: E402
from verl.checkpoint_engine import CheckpointEngineManager, CheckpointEngineRegistry  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngineWorker  # noqa: E402
from verl.single_controller.base import Worker  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from verl.utils.import_utils import import_external_libs  # noqa: E402
from verl.workers.config import CheckpointEngineConfig, RolloutConfig  # noqa: E402
from verl.workers.engine.spec import ShardSpec  # noqa: E402
from verl.workers.rollout import BaseRollout  # noqa: E402

ENGINE_MODULE = "rollmux.adapters.verl.checkpoint_engine"
N_TRAINERS, N_ROLLOUTS = 2, 3
WINDOW_BYTES = 256  # several windows per sync ...
SYNC_BUCKET_MB = 64 / (1 << 20)  # ... and several 64-byte stage-1 buckets per window

SHAPES: dict[str, tuple[tuple[int, ...], Any]] = {
    "model.embed_tokens.weight": ((11, 6), torch.bfloat16),  # rows not divisible by the trainers
    "model.layers.0.self_attn.qkv.weight": ((9, 4, 3), torch.bfloat16),
    "model.layers.0.input_layernorm.weight": ((6,), torch.float32),
    "model.layers.0.mlp.up_proj.weight": ((1, 13), torch.float16),  # fewer rows than trainers
    "lm_head.weight": ((40, 5), torch.bfloat16),  # larger than a window
    "model.rotary.scale": ((), torch.float32),  # a scalar: not sharded
    "model.position_ids": ((4, 7), torch.int64),
}


def make_state(shapes: dict[str, tuple[tuple[int, ...], Any]], seed: int) -> dict[str, torch.Tensor]:
    """Deterministic full weights; the first float values are NaN, -0.0 and inf to show bitwise copies."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, (shape, dtype) in shapes.items():
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen).to(dtype)
            flat = t.view(-1)
            for i, v in enumerate((float("nan"), -0.0, float("inf"))[: flat.numel()]):
                flat[i] = v
        else:
            t = torch.randint(-(2**40), 2**40, shape, generator=gen, dtype=dtype)
        state[name] = t
    return state


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


class ShardedTrainer(Worker):
    """Stand-in for veRL's ``ActorRolloutRefWorker`` (no model): its own gloo default group and
    a 1-D mesh over it hold the weights as ``Shard(0)`` DTensors, like FSDP2; the engine is built
    and driven as ``init_model`` and ``update_weights`` do."""

    def __init__(self, export: str, engine_kwargs: dict[str, Any], window_bytes: int) -> None:
        super().__init__()
        dist.init_process_group("gloo")
        self.mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.export = export
        import_external_libs(ENGINE_MODULE)
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            "rollmux", is_master=(dist.get_rank() == 0), bucket_size=window_bytes, **engine_kwargs)
        self._set(SHAPES, 0)

    def _set(self, shapes: dict[str, tuple[tuple[int, ...], Any]], seed: int) -> None:
        full = make_state(shapes, seed)
        self.params = {n: t if t.dim() == 0 else distribute_tensor(t, self.mesh, [Shard(0)]) for n, t in full.items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_state(self, shapes: dict[str, tuple[tuple[int, ...], Any]], seed: int, shard_dim: int = 0) -> None:
        self._set(shapes, seed)
        if shard_dim:
            name = next(n for n, p in self.params.items() if isinstance(p, DTensor))
            self.params[name] = distribute_tensor(self.params[name].full_tensor(), self.mesh, [Shard(shard_dim)])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def tune(self, window_bytes: int, sync_bucket_bytes: int) -> None:
        self.checkpoint_engine.bucket_size = window_bytes
        self.checkpoint_engine.sync_bucket_bytes = sync_bucket_bytes

    def get_per_tensor_param_shard(self) -> tuple[Iterator[tuple[str, torch.Tensor, ShardSpec]], None]:
        """The export of veRL's FSDP engine: each rank's local shard with its ShardSpec."""
        def gen() -> Iterator[tuple[str, torch.Tensor, ShardSpec]]:
            for name, p in self.params.items():
                local = p.to_local() if isinstance(p, DTensor) else p
                yield name, local.reshape(-1), ShardSpec.from_param(p)
        return gen(), None

    def _full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """veRL's get_per_tensor_param: every rank all-gathers every tensor (real gloo)."""
        for name, p in self.params.items():
            yield name, p.full_tensor() if isinstance(p, DTensor) else p

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict[str, float]:
        weights = self if self.export == "shard" else self._full_tensors()
        return await self.checkpoint_engine.send_weights(weights, global_steps=global_steps)

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)


class RecordingAdapter(BaseRollout):
    """Stand-in for veRL's vLLM/SGLang ``ServerAdapter``: keeps what ``update_weights`` streams in."""

    def __init__(self) -> None:  # no engine behind it, so BaseRollout's config parsing is skipped
        self.received: dict[str, torch.Tensor] = {}
        self.formats: list[str] = []

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        self.formats.append(wire_format)
        self.received = {}
        async for name, tensor in weights:
            self.received[name] = tensor

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None


class RecordingRolloutWorker(CheckpointEngineWorker):
    """veRL's ``CheckpointEngineWorker`` plus a getter for what its adapter received."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def received(self, digest: bool = False) -> Any:
        got = self.server_adapter.received
        if digest:
            return {n: hashlib.sha256(_bits(t).numpy().tobytes()).hexdigest() for n, t in got.items()}
        return got

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wire_formats(self) -> list[str]:
        return self.server_adapter.formats


class StandInReplica:
    """Stand-in for a ``RolloutReplica``: its workers plus the calls the manager awaits around a sync."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None


def _config() -> CheckpointEngineConfig:
    return CheckpointEngineConfig(backend="rollmux", update_weights_bucket_megabytes=1,
                                  engine_kwargs={"rollmux": {"depth": 2}}, custom_backend_module=ENGINE_MODULE)


def _ray_init(**kwargs: Any) -> None:
    """`ray.init`, tried twice: Ray gives its raylet a fixed 30 s to come up, which a 2-core box still
    busy tearing down the previous tests' Ray instances can miss (seen once in a full run)."""
    try:
        ray.init(**kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        ray.init(**kwargs)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    """One local Ray instance: two trainer groups (shard and full-tensor export), one rollout group."""
    _ray_init(num_cpus=16, include_dashboard=False, log_to_driver=False, namespace="rollmux-ckpt-test")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # site-packages has a `tests` package
    try:
        kwargs = {"depth": 2, "sync_bucket_megabytes": SYNC_BUCKET_MB}
        trainers = {
            export: RayWorkerGroup(
                resource_pool=RayResourcePool([N_TRAINERS], use_gpu=False, max_colocate_count=1),
                ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(ShardedTrainer), export=export,
                                                       engine_kwargs=kwargs, window_bytes=WINDOW_BYTES))
            for export in ("shard", "full")
        }
        rollout_config = RolloutConfig(name="recording", checkpoint_engine=_config())
        rollouts = RayWorkerGroup(
            resource_pool=RayResourcePool([N_ROLLOUTS], use_gpu=False, max_colocate_count=1),
            ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(RecordingRolloutWorker),
                                                   rollout_config=rollout_config, model_config=None,
                                                   server_adapter=RecordingAdapter()))
        yield {"trainers": trainers, "rollouts": rollouts}
    finally:
        ray.shutdown()


def _sync(cluster: dict[str, Any], export: str, step: int) -> dict[str, float]:
    """veRL's own CheckpointEngineManager.update_weights, from trainer group `export` to the rollouts."""
    manager = CheckpointEngineManager(config=_config(), actor_wg=cluster["trainers"][export],
                                      replicas=[StandInReplica(cluster["rollouts"].workers)])
    return manager.update_weights(global_steps=step)


def _assert_bitwise(received: list[dict[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> None:
    assert len(received) == N_ROLLOUTS
    for r, got in enumerate(received):
        assert list(got) == list(expected), f"rollout {r} got {list(got)}"
        for name, want in expected.items():
            t = got[name]
            assert t.dtype == want.dtype and t.shape == want.shape, (r, name, t.dtype, t.shape)
            assert torch.equal(_bits(t), _bits(want)), f"rollout {r}: {name} differs"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rollout_ranks_receive_the_trainers_weights_bit_for_bit(cluster: dict[str, Any]) -> None:
    for step, export in enumerate(("shard", "full", "shard"), start=1):
        seed = step  # new weights every step, through a world kept across steps
        cluster["trainers"][export].set_state(SHAPES, seed)
        metrics = _sync(cluster, export, step)
        _assert_bitwise(cluster["rollouts"].received(), make_state(SHAPES, seed))
        assert metrics["rollmux_sync/sent_bytes"] > 0
    assert cluster["rollouts"].wire_formats() == [["named_tensors"] * 3] * N_ROLLOUTS


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_unsupported_layout_fails_every_rank_naming_the_parameter(cluster: dict[str, Any]) -> None:
    trainers = cluster["trainers"]["shard"]
    trainers.set_state(SHAPES, 7, shard_dim=1)
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        _sync(cluster, "shard", 10)
    assert "model.embed_tokens.weight" in str(err.value) and "Shard(0)" in str(err.value)
    trainers.set_state(SHAPES, 8)  # the world is still usable afterwards
    _sync(cluster, "shard", 11)
    _assert_bitwise(cluster["rollouts"].received(), make_state(SHAPES, 8))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cpu_path_bytes_per_second_for_64_mb(cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A micro figure, printed, not asserted: 64 MiB of bf16 over gloo, 2 trainers -> 3 rollout ranks."""
    shapes = {f"bench.{i}": ((2048, 4096), torch.bfloat16) for i in range(4)}  # 4 x 16 MiB
    trainers = cluster["trainers"]["shard"]
    trainers.tune(32 << 20, 8 << 20)  # veRL's default window is 2 GiB; 32 MiB windows here
    trainers.set_state(shapes, 3)
    start = time.perf_counter()
    metrics = _sync(cluster, "shard", 20)
    wall = time.perf_counter() - start
    want = make_state(shapes, 3)
    digests = {n: hashlib.sha256(_bits(t).numpy().tobytes()).hexdigest() for n, t in want.items()}
    assert cluster["rollouts"].received(digest=True) == [digests] * N_ROLLOUTS
    total = sum(t.numel() * t.element_size() for t in want.values())
    with capsys.disabled():
        print(f"\n[rollmux ckpt-engine, CPU/gloo] {total / 2**20:.0f} MiB, {N_TRAINERS} trainers -> "
              f"{N_ROLLOUTS} rollout ranks: {total / wall / 1e6:.0f} MB/s end to end ({wall:.2f} s incl. "
              f"manager RPCs); trainer 0 sent {metrics['rollmux_sync/sent_bytes'] / 2**20:.0f} MiB at "
              f"{metrics['rollmux_sync/bytes_per_s'] / 1e6:.0f} MB/s")


def test_bad_options_are_refused_with_the_option_named() -> None:
    import_external_libs(ENGINE_MODULE)
    with pytest.raises(ValueError, match=r"engine_kwargs\.rollmux\.transport='rdma'"):
        CheckpointEngineRegistry.new("rollmux", bucket_size=1 << 20, transport="rdma")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            CheckpointEngineRegistry.new("rollmux", bucket_size=1 << 20, transport="nccl")
    with pytest.raises(ValueError, match=r"unknown .*options \['bucket_mb'\]"):
        CheckpointEngineRegistry.new("rollmux", bucket_size=1 << 20, bucket_mb=3)
    with pytest.raises(ValueError, match="depth=0 must be a positive integer"):
        CheckpointEngineRegistry.new("rollmux", bucket_size=1 << 20, depth=0)
    cls = CheckpointEngineRegistry.get("rollmux")
    worker = {"world": None, "rank": -1, "size": 0, "trainers": 0, "master": None}
    with pytest.raises(ValueError, match="actor rank 0 reported no rollmux rendezvous store"):
        cls.build_topology(2, 3, [worker] * 5)
    with pytest.raises(ValueError, match="at least one actor and one rollout worker"):
        cls.build_topology(2, 0, [worker] * 2)


def test_topology_every_actor_rank_sends_and_the_world_is_kept_while_membership_holds() -> None:
    import_external_libs(ENGINE_MODULE)
    cls = CheckpointEngineRegistry.get("rollmux")
    master = {"host": "10.0.0.1", "port": 4242}
    fresh = [{"world": None, "rank": -1, "size": 0, "trainers": 0, "master": master if i == 0 else None}
             for i in range(5)]
    actor, rollout = cls.build_topology(2, 3, fresh)
    assert actor["rank"] == [0, 1] and rollout["rank"] == [2, 3, 4]
    assert actor["n_trainers"] == [2, 2] and rollout["world_size"] == [5] * 3
    world = actor["world_id"][0]
    joined = [{**m, "world": world, "rank": i, "size": 5, "trainers": 2} for i, m in enumerate(fresh)]
    assert cls.build_topology(2, 3, joined)[1]["world_id"] == [world] * 3  # kept
    assert cls.build_topology(2, 4, [*joined, fresh[1]])[0]["world_id"][0] != world  # a replica joined


def test_ranks_sharing_a_gpu_under_nccl_are_refused_before_any_transfer() -> None:
    """A co-located job: trainer and rollout workers report the same GPU from ``prepare``."""
    import_external_libs(ENGINE_MODULE)
    from rollmux.adapters.verl.checkpoint_engine import shared_gpus

    cls = CheckpointEngineRegistry.get("rollmux")
    master = {"host": "10.0.0.1", "port": 4242}
    gpus = ["10.0.0.1/GPU-a", "10.0.0.1/GPU-b", "10.0.0.1/GPU-a", "10.0.0.1/GPU-c"]
    workers = [{"world": None, "rank": -1, "size": 0, "trainers": 0, "master": master if i == 0 else None,
                "gpu": g} for i, g in enumerate(gpus)]
    assert shared_gpus(workers) == {"10.0.0.1/GPU-a": [0, 2]}
    with pytest.raises(ValueError, match=r"ranks \[0, 2\] on GPU 10.0.0.1/GPU-a.*co-located"):
        cls.build_topology(2, 2, workers)
    apart = [{**w, "gpu": f"10.0.0.1/GPU-{i}"} for i, w in enumerate(workers)]
    assert cls.build_topology(2, 2, apart)[1]["rank"] == [2, 3]
    gloo = [{**w, "gpu": None} for w in workers]  # gloo reports no GPU: several ranks per GPU are fine
    assert cls.build_topology(2, 2, gloo)[0]["rank"] == [0, 1]


def test_backend_is_registered_by_the_opted_in_plugin_only(tmp_path: Any) -> None:
    from tests.adapters.conftest import run_fresh

    code = '''
import verl.checkpoint_engine as ce
print("rollmux" in ce.CheckpointEngineRegistry._registry)
'''
    off = run_fresh(code)
    on = run_fresh(code, env={"ROLLMUX_SIDECAR_SOCKET": str(tmp_path / "none.sock")})
    assert off.returncode == 0 and on.returncode == 0, off.stderr[-2000:] + on.stderr[-2000:]
    assert off.stdout.split()[-1] == "False" and on.stdout.split()[-1] == "True"
