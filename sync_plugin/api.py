"""Contracts of the weight sync plugin: topology, parameter metadata, transfer plan, errors.

Everything here is plain data and imports no torch, so the coordinator and the planner tests can use
it from a slim install. The collective code (``two_stage.py``, ``baselines.py``) consumes these types.

Vocabulary: a *trainer* rank holds the freshly trained weights, a *rollout* rank needs a full replica.
The *cut* is the slow cross-cluster link between the two groups. Byte offsets refer to the *global
stream*: every parameter's bytes concatenated in metadata order.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from rollmux.core.errors import RollMuxError


class SyncError(RollMuxError):
    """Base class of every error the weight sync plugin raises on purpose."""


class TopologyError(SyncError, ValueError):
    """The trainer/rollout rank sets are invalid (empty, overlapping, duplicated, out of the world)."""


class MetadataMismatchError(SyncError):
    """Trainer and rollout ranks disagree on the parameter list (names, shapes or dtypes)."""


class PlanError(SyncError, ValueError):
    """A transfer plan cannot be built or does not match the tensors handed to send/receive."""


class Scheme(str, enum.Enum):
    """How weights travel from trainer ranks to rollout ranks."""

    TWO_STAGE = "two_stage"
    """Ours: disjoint shards cross the cut once (stage 1), rollout ranks all-gather them (stage 2)."""
    STAR = "star"
    """Baseline: trainer rank 0 sends the full model to every rollout rank across the cut."""
    BROADCAST = "broadcast"
    """Baseline: ``torch.distributed.broadcast`` from trainer rank 0 over a group spanning both clusters."""


class Sharding(str, enum.Enum):
    """Which bytes of the global stream each trainer rank owns (and can send without gathering)."""

    FLAT = "flat"
    """Contiguous, even split of the global stream (FSDP1 flat-parameter style)."""
    DIM0 = "dim0"
    """Every parameter split along dim 0 in ``torch.chunk`` fashion (FSDP2 ``Shard(0)`` style)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncTopology:
    """Which global ranks train and which serve rollouts.

    All ranks of the default process group must call the group-creating functions, but only the
    ranks listed here move weights.
    """

    trainer_ranks: tuple[int, ...]
    """Global ranks holding the trained weights (the sending cluster), in shard order."""
    rollout_ranks: tuple[int, ...]
    """Global ranks that need a full replica (the receiving cluster), in piece order."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trainer_ranks", tuple(int(r) for r in self.trainer_ranks))
        object.__setattr__(self, "rollout_ranks", tuple(int(r) for r in self.rollout_ranks))
        _check_rank_set("trainer_ranks", self.trainer_ranks)
        _check_rank_set("rollout_ranks", self.rollout_ranks)
        both = sorted(set(self.trainer_ranks) & set(self.rollout_ranks))
        if both:
            raise TopologyError(
                f"ranks {both} are in both trainer_ranks={self.trainer_ranks} and "
                f"rollout_ranks={self.rollout_ranks}; a rank is either a trainer or a rollout rank"
            )

    @property
    def n_trainers(self) -> int:
        """Number of trainer ranks (N_T)."""
        return len(self.trainer_ranks)

    @property
    def n_rollouts(self) -> int:
        """Number of rollout ranks (N_R, the paper's R)."""
        return len(self.rollout_ranks)

    @property
    def source_rank(self) -> int:
        """The single source of the baselines (trainer rank 0 of the topology)."""
        return self.trainer_ranks[0]

    def check_world(self, world_size: int) -> None:
        """Check that every listed rank exists in a world of ``world_size`` ranks.

        Raises:
            TopologyError: a rank is negative or not below ``world_size``.
        """
        outside = sorted(r for r in (*self.trainer_ranks, *self.rollout_ranks) if r >= world_size)
        if outside:
            raise TopologyError(
                f"ranks {outside} are not in the default process group of world_size={world_size}; "
                "fix the topology or initialise torch.distributed with all ranks"
            )

    def role(self, rank: int) -> str:
        """Return ``"trainer"``, ``"rollout"`` or ``"idle"`` for a global rank."""
        if rank in self.trainer_ranks:
            return "trainer"
        if rank in self.rollout_ranks:
            return "rollout"
        return "idle"


def _check_rank_set(field: str, ranks: tuple[int, ...]) -> None:
    if not ranks:
        raise TopologyError(f"{field} is empty; weight sync needs at least one trainer and one rollout rank")
    negative = [r for r in ranks if r < 0]
    if negative:
        raise TopologyError(f"{field}={ranks} has negative ranks {negative}")
    dup = sorted({r for r in ranks if ranks.count(r) > 1})
    if dup:
        raise TopologyError(f"{field}={ranks} lists ranks {dup} more than once")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamMeta:
    """What sender and receiver must agree on for one parameter."""

    name: str
    """Parameter name, e.g. ``layers.0.attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""
    dtype: str
    """Torch dtype name without the ``torch.`` prefix, e.g. ``bfloat16``."""
    itemsize: int
    """Bytes per element."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.itemsize <= 0:
            raise PlanError(f"parameter {self.name!r}: itemsize={self.itemsize} must be positive")
        if any(d < 0 for d in self.shape):
            raise PlanError(f"parameter {self.name!r}: shape={self.shape} has a negative dimension")

    @property
    def numel(self) -> int:
        """Number of elements of the full parameter."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the full parameter."""
        return self.numel * self.itemsize

    def describe(self) -> str:
        """Human-readable ``name shape dtype`` used in error messages."""
        return f"{self.name!r} shape={self.shape} dtype={self.dtype}"


def metadata_digest(metadata: tuple[ParamMeta, ...]) -> str:
    """Return a SHA-256 hex digest of the ordered names, shapes and dtypes."""
    h = hashlib.sha256()
    for m in metadata:
        h.update(f"{m.name}\0{m.shape}\0{m.dtype}\0{m.itemsize}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """A contiguous byte range, ``[start, start + length)``."""

    start: int
    """First byte."""
    length: int
    """Bytes."""

    @property
    def stop(self) -> int:
        """One past the last byte."""
        return self.start + self.length


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One stage-1 point-to-point message: part of a trainer's chunk into part of a rollout's piece."""

    bucket: int
    """Bucket index."""
    trainer: int
    """Index into ``trainer_ranks`` of the sender."""
    rollout: int
    """Index into ``rollout_ranks`` of the receiver."""
    src_offset: int
    """Byte offset in the sender's local stream (its owned bytes, concatenated in order)."""
    dst_offset: int
    """Byte offset in the receiver's piece of this bucket."""
    length: int
    """Bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where bytes of a gathered bucket land in a parameter."""

    bucket_offset: int
    """Byte offset in the gathered bucket buffer."""
    param: int
    """Index into the plan's metadata."""
    param_offset: int
    """Byte offset inside that parameter."""
    length: int
    """Bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketPlan:
    """One bucket: who sends what to whom (stage 1) and how the gathered bytes map to parameters."""

    index: int
    """Bucket index, also the point-to-point tag."""
    nbytes: int
    """Payload bytes of the bucket (sum of the trainers' chunks)."""
    piece_bytes: int
    """Bytes of each rollout rank's piece; the gathered buffer is ``piece_bytes * n_rollouts`` (padded)."""
    chunks: tuple[Span, ...]
    """Per trainer: its chunk as a span of its local stream (length 0 when it has nothing left)."""
    transfers: tuple[Transfer, ...]
    """Stage-1 messages of this bucket."""
    placements: tuple[Placement, ...]
    """Gathered-bucket bytes to parameter bytes, covering ``[0, nbytes)`` exactly once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferPlan:
    """The whole two-stage schedule, computed before any collective call."""

    topology: SyncTopology
    """Ranks involved."""
    metadata: tuple[ParamMeta, ...]
    """Parameters in global-stream order."""
    sharding: Sharding
    """How trainer ranks own the global stream."""
    bucket_bytes: int
    """Target payload bytes per bucket."""
    ownership: tuple[tuple[Span, ...], ...]
    """Per trainer: the global-stream spans it owns, in order (its local stream)."""
    buckets: tuple[BucketPlan, ...]
    """Buckets in send order."""

    @property
    def total_bytes(self) -> int:
        """Model size M in bytes."""
        return sum(m.nbytes for m in self.metadata)

    def local_bytes(self, trainer: int) -> int:
        """Bytes trainer ``trainer`` (an index into ``trainer_ranks``) owns and sends."""
        return sum(s.length for s in self.ownership[trainer])

    def cut_bytes(self) -> int:
        """Payload bytes that cross the cut in stage 1 (always ``total_bytes``)."""
        return sum(t.length for b in self.buckets for t in b.transfers)
