"""Warm-start state cache: park a job's device state in host buffers between phases, bring it back.

At a phase boundary the shim offloads the job's registered state (module parameters, buffers and
gradients, optimizer state such as Adam's ``exp_avg``, loose tensors) into host buffers that were
allocated once for the job, releases the device memory, and on the next permit reloads it. After a
reload every tensor holds the same bytes as before (bitwise), at the same shapes, strides and views.

How it is fast (see shared/reference/offload_sidecar.md, section 3):

- Pin once. Host buffers are chunks of ``chunk_bytes`` (pinned when CUDA is available) allocated the
  first time they are needed (or up front with :meth:`StateCache.reserve`) and reused every phase;
  they grow only if the registered state grows (Adam's state appears after the first step).
- Chunked copies on several streams. The state is laid out as one byte stream cut into chunk-sized
  segments; on CUDA the segments are issued round-robin on ``num_streams`` side streams with
  ``non_blocking`` copies and one synchronisation at the end. On CPU the same plan runs as plain
  chunked copies, so the tests cover the same logic.
- Free by storage. Offload resizes each registered tensor's storage to zero bytes and reload resizes it
  back, so views, tied weights and ``nn.Parameter`` objects stay valid, and on CPU the released memory
  is real (it shows up in ``device_bytes()`` and the process RSS). Wrapper tensors (FSDP2's ``DTensor``)
  are cached through the plain tensors inside them: this rank's shard.

The lifecycle is an explicit state machine (:data:`TRANSITIONS`); :meth:`StateCache.offload` and
:meth:`StateCache.reload` are idempotent, and a failed copy rolls back to the previous stable state once
the copies already issued have finished (no storage is freed under a running copy).

Torch is imported inside functions only: the sidecar daemon imports this package without torch.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rollmux.core.errors import RollMuxError
from rollmux.core.lifecycle import IllegalTransitionError as _IllegalTransition
from rollmux.core.lifecycle import check_transition

if TYPE_CHECKING:
    import torch

MiB = 1 << 20
DEFAULT_CHUNK_BYTES = 64 * MiB
"""Copy granularity and host-buffer chunk size: 64-512 MiB keeps PCIe at line rate (reference, section 3)."""


class StateCacheError(RollMuxError):
    """Base class of every error the state cache raises on purpose."""


class CacheTransitionError(StateCacheError, _IllegalTransition):
    """A state change that :data:`TRANSITIONS` does not allow (e.g. reload while offloading)."""


class RegistrationError(StateCacheError, ValueError):
    """A registered object cannot be cached as given (wrong state, device or tensor kind)."""


class CacheState(str, enum.Enum):
    """Where a job's registered state lives.

    RESIDENT and OFFLOADED are stable; OFFLOADING and LOADING last only while a copy runs, so seeing
    one of them from another call means two callers raced (or a process died mid-copy).
    """

    RESIDENT = "resident"  # on the device; host buffers (if any) hold stale bytes
    OFFLOADING = "offloading"  # device -> host copy running; device copy still valid
    OFFLOADED = "offloaded"  # host buffers hold the state; device storages released
    LOADING = "loading"  # device storages reallocated, host -> device copy running


S = CacheState
TRANSITIONS: dict[CacheState, frozenset[CacheState]] = {
    S.RESIDENT: frozenset(
        {
            S.OFFLOADING,  # offload() called at the end of a phase: device -> host copies begin
        }
    ),
    S.OFFLOADING: frozenset(
        {
            S.OFFLOADED,  # every segment is on the host and every device storage was resized to 0
            S.RESIDENT,  # the copy failed before any storage was released: the device copy is intact
        }
    ),
    S.OFFLOADED: frozenset(
        {
            S.LOADING,  # reload() called on a permit: device storages reallocated, host -> device begins
        }
    ),
    S.LOADING: frozenset(
        {
            S.RESIDENT,  # every segment is back on the device: the phase may run
            S.OFFLOADED,  # reload failed (e.g. device OOM): storages released again, host copy intact
        }
    ),
}
"""The whole state machine: state -> states it may move to, each edge commented with its cause."""
del S


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One entry of :attr:`StateCache.history`."""

    src: CacheState  # state before the change
    dst: CacheState  # state after the change
    time_ns: int  # clock reading when the change happened
    detail: str = ""  # why (the error that caused a rollback, for example)


@dataclass(frozen=True, slots=True)
class CopyStats:
    """What one offload or reload did and how long it took."""

    direction: str  # "offload" (device -> host) or "reload" (host -> device)
    nbytes: int  # bytes copied (0 for a no-op)
    copy_s: float  # seconds spent in the chunked copies alone
    total_s: float  # seconds for the whole call, including releasing or reallocating device memory
    segments: int  # number of chunk-sized copies issued
    noop: bool = False  # True when the call found the state already where it was asked to go

    @property
    def copy_gbps(self) -> float:
        """Copy bandwidth in GB/s (1e9 bytes), 0 for a no-op."""
        return self.nbytes / self.copy_s / 1e9 if self.copy_s > 0 else 0.0

    @property
    def total_gbps(self) -> float:
        """End-to-end bandwidth in GB/s (1e9 bytes), 0 for a no-op."""
        return self.nbytes / self.total_s / 1e9 if self.total_s > 0 else 0.0


class Lifecycle:
    """The offload/reload state machine of one cache: current state, guarded transitions, history.

    Shared by :class:`StateCache` and the vLLM sleep-mode helper (``vllm_sleep.py``).

    Args:
        owner: names the cache in error messages (e.g. ``"state cache of job 'job-7'"``).
        clock: nanosecond clock for the history.
    """

    def __init__(self, owner: str, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.owner = owner
        self._clock = clock
        self.state = CacheState.RESIDENT
        self.history: list[TransitionRecord] = []

    def transition(self, dst: CacheState, detail: str = "") -> None:
        """Move to ``dst`` if :data:`TRANSITIONS` allows it, and record the change.

        Raises:
            CacheTransitionError: the edge is not in the table (including staying in the same state).
        """
        dst = CacheState(dst)
        check_transition(TRANSITIONS, self.state, dst, self.owner, error=CacheTransitionError,
                         hint="Another offload/reload is probably running on this cache; call "
                              "offload()/reload() from one thread only.")
        self.history.append(TransitionRecord(self.state, dst, self._clock(), detail))
        self.state = dst



class LifecycleHolder:
    """What a cache with a :class:`Lifecycle` shows of it: its state, its history, guarded transitions
    (the state cache and the vLLM sleep-mode helper hold one each)."""

    _lifecycle: Lifecycle

    @property
    def state(self) -> CacheState:
        """The current state."""
        return self._lifecycle.state

    @property
    def history(self) -> tuple[TransitionRecord, ...]:
        """Every transition so far, oldest first."""
        return tuple(self._lifecycle.history)

    def transition(self, dst: CacheState, detail: str = "") -> None:
        """Move to ``dst`` if :data:`TRANSITIONS` allows it, and record the change.

        Args:
            dst: the next state.
            detail: why, stored in the history.

        Raises:
            CacheTransitionError: the edge is not in the table (including staying in the same state).
        """
        self._lifecycle.transition(dst, detail)


@dataclass(frozen=True, slots=True)
class Segment:
    """One chunk-sized copy between a device storage and a host chunk."""

    entry: int  # index of the storage in the layout
    src_offset: int  # byte offset inside that storage
    chunk: int  # index of the host chunk
    dst_offset: int  # byte offset inside that chunk
    nbytes: int  # bytes to copy


def plan_segments(sizes: Iterable[int], chunk_bytes: int, alignment: int = 512) -> tuple[list[Segment], int]:
    """Lay storages out back to back in a byte stream and cut the stream at chunk boundaries.

    Each storage starts at an ``alignment``-byte boundary of the stream; a storage that crosses a chunk
    boundary (or is larger than a chunk) becomes several segments. Pure function: no torch.

    Args:
        sizes: byte size of each storage, in layout order.
        chunk_bytes: size of one host chunk.
        alignment: start alignment of each storage in the stream.

    Returns:
        The segments in stream order and the stream length in bytes (the host capacity needed).

    Raises:
        ValueError: chunk_bytes or alignment is not positive, or chunk_bytes is not a multiple of alignment.
    """
    if chunk_bytes <= 0 or alignment <= 0 or chunk_bytes % alignment:
        raise ValueError(
            f"chunk_bytes={chunk_bytes} must be a positive multiple of alignment={alignment}; "
            f"use e.g. {DEFAULT_CHUNK_BYTES}"
        )
    segments: list[Segment] = []
    pos = 0
    for entry, size in enumerate(sizes):
        pos = -(-pos // alignment) * alignment
        done = 0
        while done < size:
            chunk, offset = divmod(pos, chunk_bytes)
            n = min(size - done, chunk_bytes - offset)
            segments.append(Segment(entry, done, chunk, offset, n))
            done += n
            pos += n
    return segments, pos


@dataclass(kw_only=True, slots=True)
class StateCacheConfig:
    """Knobs of a :class:`StateCache`."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Host chunk size and copy granularity, in bytes."""
    num_streams: int = 4
    """CUDA side streams the segments are spread over (ignored on CPU)."""
    pin_memory: bool | None = None
    """Pin host chunks; None means: when CUDA is available and the cache's device is a GPU."""
    alignment: int = 512
    """Start alignment of each storage inside the host stream, in bytes."""
    empty_cache: bool = True
    """On CUDA, hand freed blocks back to the driver after offload so another job can use them."""

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0 or self.alignment <= 0 or self.chunk_bytes % self.alignment:
            raise ValueError(
                f"chunk_bytes={self.chunk_bytes} must be a positive multiple of alignment={self.alignment}"
            )
        if self.num_streams < 1:
            raise ValueError(f"num_streams={self.num_streams} must be at least 1")


@dataclass(slots=True)
class _Entry:
    """One distinct device storage in the layout of the current offload."""

    name: str  # first registered name that reached this storage (for error messages)
    storage: Any  # torch.UntypedStorage, shared by every tensor viewing it
    nbytes: int  # its size while resident


@dataclass(slots=True)
class _Source:
    """A registered object and how to enumerate its tensors."""

    name: str
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]] = field(repr=False)


class StateCache(LifecycleHolder):
    """One job's (one rank's) warm-start cache of device state in host buffers.

    Usage::

        cache = StateCache("job-7")
        cache.register_module("policy", model)
        cache.register_optimizer("adam", optimizer)
        cache.register_tensor("rng", rng_state)
        ...  # run a phase
        cache.offload()   # device memory released, state in (pinned) host buffers
        ...  # another job uses the device
        cache.reload()    # state back, bitwise identical
        cache.release()   # end of job: drop the host buffers

    Args:
        job_id: for messages and history.
        device: the device whose memory is cached (``cuda`` means the current GPU); None infers it from
            the registered tensors at the first offload (:func:`choose_device`: the GPU they are on,
            leaving CPU-resident optimizer scalars such as Adam's ``step`` in place; else the CPU).
        config: knobs; defaults if None.
        clock: nanosecond clock for the history (injected by tests).
        engine: issues the copies (default: :class:`CudaStreamEngine` on a GPU, :class:`SyncEngine`
            elsewhere); a test passes one whose copies are still running when ``submit`` returns.
    """

    def __init__(
        self,
        job_id: str,
        *,
        device: str | torch.device | None = None,
        config: StateCacheConfig | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        engine: CopyEngine | None = None,
    ) -> None:
        self.job_id = job_id
        self.config = config or StateCacheConfig()
        self._device: Any = None if device is None else _torch().device(device)
        self._lifecycle = Lifecycle(f"state cache of job {job_id!r}", clock)
        self._sources: list[_Source] = []
        self._optimizers: list[Any] = []  # registered optimizers (their state may appear later)
        self._chunks: list[torch.Tensor] = []  # host buffers, each a flat uint8 tensor
        self._entries: list[_Entry] = []  # layout of the last offload
        self._segments: list[Segment] = []
        self._copier = engine
        self.host_allocations = 0
        """How many host chunks were ever allocated (stays put across phases once warm)."""

    # ---------------------------------------------------------------------------- registration

    def register_module(self, name: str, module: torch.nn.Module, *, include_grads: bool = True) -> None:
        """Cache a module's parameters and buffers (and gradients that exist at offload time).

        Raises:
            RegistrationError: the cache is not resident, or the name is taken.
        """

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for pname, param in module.named_parameters():
                yield pname, param
                if include_grads and param.grad is not None:
                    yield f"{pname}.grad", param.grad
            yield from module.named_buffers()

        self._add(name, tensors)

    def register_optimizer(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Cache an optimizer's state tensors (e.g. Adam ``exp_avg``/``exp_avg_sq``/``step``).

        The parameters themselves belong to the module: register it too. State that appears later
        (Adam creates it at the first step) is picked up at each offload.

        Raises:
            RegistrationError: the cache is not resident, or the name is taken.
        """

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            torch = _torch()
            for i, per_param in enumerate(optimizer.state.values()):
                for key, value in per_param.items():
                    if torch.is_tensor(value):
                        yield f"{i}.{key}", value

        self._add(name, tensors)
        self._optimizers.append(optimizer)

    def register_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """Cache one loose tensor (its whole storage).

        Raises:
            RegistrationError: the cache is not resident, the name is taken, or it is not a tensor.
        """
        if not _torch().is_tensor(tensor):
            raise RegistrationError(f"register_tensor({name!r}) got a {type(tensor).__name__}, not a tensor")

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            yield "", tensor

        self._add(name, tensors)

    def _add(self, name: str, tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> None:
        if self.state is not CacheState.RESIDENT:
            raise RegistrationError(
                f"state cache of job {self.job_id!r} is {self.state.value!r}; register {name!r} while the "
                "state is resident (reload() first)"
            )
        if any(s.name == name for s in self._sources):
            raise RegistrationError(
                f"name {name!r} is already registered with the cache of job {self.job_id!r}"
            )
        self._sources.append(_Source(name, tensors))

    # ------------------------------------------------------------------------------ accounting

    def host_bytes(self) -> int:
        """Bytes of host memory held by this cache's buffers (pinned where CUDA is available)."""
        return sum(c.numel() for c in self._chunks)

    def device_bytes(self) -> int:
        """Bytes of device memory held by the registered storages right now (0 once offloaded)."""
        if self.state is CacheState.OFFLOADED:
            return sum(e.storage.nbytes() for e in self._entries)
        return sum(e.nbytes for e in self._collect())

    @property
    def pinned(self) -> bool:
        """Whether the host chunks are (or will be) pinned."""
        if self.config.pin_memory is not None:
            return self.config.pin_memory
        if self._device is not None and self._device.type != "cuda":
            return False  # a CPU cache never initialises CUDA (is_available() may create a driver context)
        return bool(_torch().cuda.is_available())

    def reserve(self, nbytes: int) -> None:
        """Allocate host buffers for ``nbytes`` now (at admission) rather than at the first offload.

        Pinning is slow (about 1-3 GB/s), so doing it before the first phase boundary keeps it off the
        critical path. The device is inferred from the registered state first, so a CPU cache pins nothing.
        """
        if self._device is None and self._sources and self.state is CacheState.RESIDENT:
            self._collect()
        self._ensure_capacity(nbytes)

    def expected_bytes(self) -> int:
        """Host bytes the first offload will need, as far as registration tells: the registered storages
        now, plus what training creates for the parameters of a registered optimizer: their gradients
        and the state an Adam-like or momentum optimizer creates at its first step.

        Parameters no registered optimizer trains (a rollout's policy) are not given gradients; what this
        misses is allocated at the first offload, as without a reservation.
        """
        if self.state is not CacheState.RESIDENT:
            return self.host_bytes()
        entries = self._collect()
        align = self.config.alignment

        def aligned(t: Any) -> int:
            return -(-t.numel() * t.element_size() // align) * align

        total = sum(-(-e.nbytes // align) * align for e in entries)
        for optimizer in self._optimizers:
            slots = 0 if optimizer.state else _optimizer_slots(optimizer)  # existing state was counted above
            for group in optimizer.param_groups:
                # Adam's ``step`` counter is a host scalar unless capturable or fused keep it on the device.
                step_here = slots > 0 and _adam_like(optimizer) and (
                    self._device.type == "cpu" or bool(group.get("capturable") or group.get("fused")))
                for param in group["params"]:
                    local = _plain(param)
                    if local.device != self._device:
                        continue
                    total += slots * aligned(local) + (align if step_here else 0)
                    total += aligned(local) if param.grad is None else 0  # its gradient, after a backward
        return total

    def release(self) -> None:
        """Drop the host buffers (end of job). The cache can still be used; buffers come back on demand.

        Raises:
            StateCacheError: the state is not resident, so the buffers hold the only copy.
        """
        if self.state is not CacheState.RESIDENT:
            raise StateCacheError(
                f"state cache of job {self.job_id!r} is {self.state.value!r}: its host buffers hold the only "
                "copy of the state; reload() before release()"
            )
        self._chunks = []
        self._entries, self._segments = [], []

    # -------------------------------------------------------------------------- offload/reload

    def offload(self) -> CopyStats:
        """Copy the registered state to host buffers and release its device memory. Idempotent.

        Returns:
            What was copied and how long it took (``noop=True`` if already offloaded).

        Raises:
            CacheTransitionError: an offload or reload is already running.
            RegistrationError: a registered tensor cannot be cached (external or mixed-device storage).
        """
        if self.state is CacheState.OFFLOADED:
            return CopyStats("offload", 0, 0.0, 0.0, 0, noop=True)
        start = time.perf_counter()
        self.transition(CacheState.OFFLOADING)
        try:
            entries = self._collect()
            segments, total = plan_segments(
                [e.nbytes for e in entries], self.config.chunk_bytes, self.config.alignment
            )
            self._ensure_capacity(total)
            copy_start = time.perf_counter()
            self._copy(entries, segments, to_host=True)
            copy_s = time.perf_counter() - copy_start
        except BaseException as exc:
            self._drain()  # copies already issued still read the device state: let them end first
            self.transition(CacheState.RESIDENT, f"offload failed: {exc!r}")
            raise
        self._entries, self._segments = entries, segments
        for e in entries:
            e.storage.resize_(0)
        if self._device.type == "cuda" and self.config.empty_cache:
            _torch().cuda.empty_cache()
        self.transition(CacheState.OFFLOADED, f"{sum(e.nbytes for e in entries)} bytes")
        return CopyStats(
            "offload", sum(e.nbytes for e in entries), copy_s, time.perf_counter() - start, len(segments)
        )

    def reload(self) -> CopyStats:
        """Reallocate the device storages and copy the state back. Idempotent.

        Returns:
            What was copied and how long it took (``noop=True`` if already resident).

        Raises:
            CacheTransitionError: an offload or reload is already running.
        """
        if self.state is CacheState.RESIDENT:
            return CopyStats("reload", 0, 0.0, 0.0, 0, noop=True)
        start = time.perf_counter()
        self.transition(CacheState.LOADING)
        try:
            for e in self._entries:
                e.storage.resize_(e.nbytes)
            copy_start = time.perf_counter()
            self._copy(self._entries, self._segments, to_host=False)
            copy_s = time.perf_counter() - copy_start
        except BaseException as exc:
            self._drain()  # copies already issued still write into the storages: never free under them
            for e in self._entries:
                e.storage.resize_(0)
            self.transition(CacheState.OFFLOADED, f"reload failed: {exc!r}")
            raise
        nbytes = sum(e.nbytes for e in self._entries)
        self.transition(CacheState.RESIDENT, f"{nbytes} bytes")
        return CopyStats("reload", nbytes, copy_s, time.perf_counter() - start, len(self._segments))

    # -------------------------------------------------------------------------------- internals

    def _collect(self) -> list[_Entry]:
        """The distinct device storages reachable from the registered objects, in registration order."""
        named = [leaf for source in self._sources for tname, t in source.tensors()
                 for leaf in _leaves(f"{source.name}.{tname}" if tname else source.name, t)]
        if self._device is None:
            self._device = choose_device(
                (TensorPlacement(name=n, device=t.device, scalar=t.numel() <= 1) for n, t in named),
                f"job {self.job_id!r}")
        elif self._device.index is None and self._device.type not in _INDEXLESS:
            self._device = canonical_device(self._device)
        found: dict[int, _Entry] = {}
        for name, t in named:
            if t.device != self._device:
                continue  # e.g. Adam's CPU "step" counter beside GPU state: it holds no device memory
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in found:
                continue  # empty, or a view/tied weight of a storage already listed
            if not storage.resizable():
                raise RegistrationError(
                    f"tensor {name!r} of job {self.job_id!r} uses external memory (not resizable), so its "
                    "device memory cannot be released; register a tensor that owns its storage (clone it)"
                )
            found[storage.data_ptr()] = _Entry(name, storage, storage.nbytes())
        return list(found.values())

    def _ensure_capacity(self, nbytes: int) -> None:
        """Grow the host chunks to hold ``nbytes``; never shrinks, so steady state allocates nothing."""
        torch = _torch()
        chunk = self.config.chunk_bytes
        have = self.host_bytes()
        if nbytes <= have:
            return
        pin = self.pinned
        # Chunks are full-sized except possibly the last; a short last chunk is replaced when growing.
        if self._chunks and self._chunks[-1].numel() < chunk:
            self._chunks.pop()
        while self.host_bytes() < nbytes:
            size = min(
                chunk, -(-(nbytes - self.host_bytes()) // self.config.alignment) * self.config.alignment
            )
            self._chunks.append(torch.empty(size, dtype=torch.uint8, pin_memory=pin))
            self.host_allocations += 1

    def _copy(self, entries: list[_Entry], segments: list[Segment], *, to_host: bool) -> None:
        engine = self._engine()
        views = [_byte_view(e.storage, e.nbytes, self._device) for e in entries]
        engine.begin()
        for i, s in enumerate(segments):
            dev = views[s.entry][s.src_offset : s.src_offset + s.nbytes]
            host = self._chunks[s.chunk][s.dst_offset : s.dst_offset + s.nbytes]
            engine.submit(i, host if to_host else dev, dev if to_host else host)
        # One wait at the end: offload must finish before storages are freed, reload before the phase runs.
        engine.wait()

    def _engine(self) -> CopyEngine:
        """How segments are copied: CUDA side streams on a GPU, plain copies elsewhere (kept per cache)."""
        if self._copier is None:
            self._copier = (CudaStreamEngine(self._device, self.config.num_streams) if self._device.type == "cuda"
                            else SyncEngine())
        return self._copier

    def _drain(self) -> None:
        """Wait for every copy already issued (after a failure, before storages are freed or reused)."""
        if self._copier is None:
            return
        with contextlib.suppress(BaseException):  # the first error is the one raised; the device may be lost
            self._copier.wait()


class CopyEngine(Protocol):
    """Issues one cache's segment copies and waits for them (CUDA streams, or plain copies)."""

    def begin(self) -> None:
        """Order the copies after the work already queued on the device (the phase, a reallocation)."""
        ...

    def submit(self, index: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Issue one segment's copy; it may still run when this returns."""
        ...

    def wait(self) -> None:
        """Return once every copy issued so far has finished. Safe to call again, and with nothing issued."""
        ...


class SyncEngine:
    """Plain copies that finish before :meth:`submit` returns (CPU caches)."""

    def begin(self) -> None:
        pass

    def submit(self, index: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def wait(self) -> None:
        pass


class CudaStreamEngine:
    """Non-blocking copies spread round-robin over side streams, so several DMA transfers overlap."""

    def __init__(self, device: Any, num_streams: int) -> None:
        torch = _torch()
        self._device = device
        self._streams = [torch.cuda.Stream(device) for _ in range(num_streams)]

    def begin(self) -> None:
        current = _torch().cuda.current_stream(self._device)
        for stream in self._streams:
            stream.wait_stream(current)

    def submit(self, index: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch = _torch()
        with torch.cuda.stream(self._streams[index % len(self._streams)]):
            dst.copy_(src, non_blocking=True)

    def wait(self) -> None:
        for stream in self._streams:
            stream.synchronize()


def _leaves(name: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain tensors that hold a registered tensor's memory, named after it.

    A wrapper subclass (FSDP2's ``DTensor``, quantised tensors) has no storage of its own: its memory is
    in the inner tensors that ``__tensor_flatten__`` names (a DTensor's ``_local_tensor``, this rank's
    shard). Resizing those storages releases the memory and keeps the wrapper valid.
    """
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        yield name, t
        return
    inner, _ = flatten()
    for attr in inner:
        value = getattr(t, attr)
        if _torch().is_tensor(value):  # a DTensor also names its device mesh, which holds no memory
            yield from _leaves(f"{name}.{attr}", value)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """The first plain tensor inside ``t`` (``t`` itself when it is plain): what it occupies on this rank."""
    return next(_leaves("", t))[1]


_ADAM_LIKE = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam"})


def _optimizer_slots(optimizer: Any) -> int:
    """How many parameter-sized state tensors the optimizer creates per parameter at its first step
    (0 when unknown: that state is then allocated at the first offload)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if _adam_like(optimizer):
        return 3 if group.get("amsgrad") else 2
    if any(c.__name__ == "SGD" for c in type(optimizer).__mro__):
        return 1 if group.get("momentum") else 0
    return 0


def _adam_like(optimizer: Any) -> bool:
    """Adam or a subclass of one of the Adam family (a wrapper that registers itself, say)."""
    return any(c.__name__ in _ADAM_LIKE for c in type(optimizer).__mro__)


_INDEXLESS = frozenset({"cpu", "meta"})
"""Device types whose tensors report no index: ``torch.device("cpu")`` already equals a CPU tensor's device."""


def canonical_device(device: str | torch.device, current_index: Callable[[str], int] | None = None) -> torch.device:
    """The device as its tensors report it: ``cuda`` becomes ``cuda:<current device>``.

    A tensor on a GPU always carries an index (``cuda:0``) and ``torch.device("cuda") != cuda:0``, so a
    cache built with an index-less device would match none of its tensors and free nothing.

    Args:
        device: a device or its name.
        current_index: device type -> index of the current device (default: ``torch.<type>.current_device``).

    Returns:
        The device with an index (CPU and meta devices unchanged).
    """
    d = _torch().device(device)
    if d.index is not None or d.type in _INDEXLESS:
        return d
    index = (current_index or _current_index)(d.type)
    return _torch().device(d.type, index)


def _current_index(device_type: str) -> int:
    return int(getattr(_torch(), device_type).current_device())


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorPlacement:
    """Where one registered tensor lives, as :func:`choose_device` sees it."""

    name: str  # registered name (for messages)
    device: Any  # torch.device the tensor is on (with its index on a GPU)
    scalar: bool  # at most one element, e.g. Adam's ``step`` counter


def choose_device(placements: Iterable[TensorPlacement], owner: str = "the cache") -> torch.device:
    """The device a cache built without ``device=`` caches: the one accelerator its tensors are on.

    Optimizers keep scalars on the host beside GPU state (``torch.optim.Adam``'s ``step`` is a CPU
    tensor unless ``capturable`` or ``fused``): such CPU scalars hold no device memory and stay where
    they are. Any other CPU tensor beside GPU state, or tensors on two accelerators, is ambiguous.

    Args:
        placements: every registered tensor's device.
        owner: names the cache in the error (e.g. ``"job 'job-7'"``).

    Returns:
        The accelerator device, or the CPU when no tensor is on an accelerator.

    Raises:
        RegistrationError: tensors on two accelerators, or a non-scalar CPU tensor beside GPU state.
    """
    torch = _torch()
    first: dict[Any, str] = {}
    host: list[str] = []
    for p in placements:
        if p.device.type == "cpu":
            if not p.scalar:
                host.append(p.name)
            continue
        first.setdefault(p.device, p.name)
    if not first:
        return torch.device("cpu")
    if len(first) > 1 or host:
        listed = ", ".join([f"{n!r} on {d}" for d, n in first.items()] + [f"{n!r} on cpu" for n in host[:1]])
        raise RegistrationError(
            f"{owner} registered tensors on several devices ({listed}); use one StateCache per device, or pass "
            "device= to cache only one of them"
        )
    return next(iter(first))


def _byte_view(storage: Any, nbytes: int, device: Any) -> torch.Tensor:
    """A flat uint8 tensor over a whole untyped storage."""
    torch = _torch()
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (nbytes,), (1,))


def _torch() -> Any:
    import torch

    return torch
