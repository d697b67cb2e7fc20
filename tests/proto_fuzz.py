"""Hypothesis strategies over protobuf messages, for fuzzing the RPC surfaces (not a test module).

:func:`message` walks a message descriptor and draws every field from hostile values for its type:
NaN, infinities, huge, negative and zero numbers, empty, oversized, non-printable and non-ASCII
strings, out-of-range enums, empty and long repeated fields and maps, unset sub-messages. `hints`
(field name -> strategy) mix in plausible values (the real job name, its token, the live epoch) so
a fuzzed call also reaches the checks behind authentication and lookup.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

OVERSIZED = 2 << 20
"""Characters in an oversized string: over the coordinator's 1 MiB request limit, under gRPC's 4 MiB."""

FLOATS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 1e300, -1.0, 0.0, -0.0, 5e-324, 86_401.0]),
    st.floats(min_value=0.001, max_value=30.0),
    st.floats(allow_nan=True, allow_infinity=True),
)
INT32 = st.one_of(st.sampled_from([-(2**31), -1, 0, 1, 2, 8, 2**31 - 1]), st.integers(-(2**31), 2**31 - 1))
INT64 = st.one_of(st.sampled_from([-(2**63), -1, 0, 1, 2**31, 2**62, 2**63 - 1]), st.integers(-(2**63), 2**63 - 1))
TEXT = st.one_of(
    st.sampled_from(["", " ", "a b", "\x00", "\n", "ü", "\u202e", "x" * 129, "../../etc/passwd", "x" * OVERSIZED]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24),
)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return FLOATS
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return INT32
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return INT64
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return TEXT
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=32)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from([-1, 99, 2**31 - 1]))
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


def message(cls: type, hints: Mapping[str, st.SearchStrategy[Any]] | None = None,
            depth: int = 0) -> st.SearchStrategy[Any]:
    """A strategy drawing instances of protobuf message class `cls` (see the module docstring)."""
    hints = hints or {}
    desc: Descriptor = cls.DESCRIPTOR

    @st.composite
    def build(draw: Callable[..., Any]) -> Any:
        msg = cls()
        for field in desc.fields:
            if not draw(st.booleans()) and field.name not in hints:
                continue  # left unset (proto3 default)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                entries = draw(st.one_of(st.dictionaries(TEXT, TEXT, max_size=3),
                                         st.just({f"k{i}": "v" * 64 for i in range(100)})))
                getattr(msg, field.name).update(entries)
            elif field.message_type is not None:
                if depth > 2:
                    continue
                sub = draw(message(_message_class(msg, field), hints, depth + 1))
                if field.is_repeated:
                    getattr(msg, field.name).append(sub)
                else:
                    getattr(msg, field.name).CopyFrom(sub)
            elif field.is_repeated:
                value = _scalar(field)
                items = draw(st.one_of(st.lists(value, max_size=4), st.just([0] * 200_000)
                                       if field.type != FieldDescriptor.TYPE_STRING else st.just(["x"] * 50_000)))
                getattr(msg, field.name).extend(items)
            else:
                plausible = field.name in hints and draw(st.integers(0, 7)) > 0  # hinted fields: 7 in 8
                setattr(msg, field.name, draw(hints[field.name] if plausible else _scalar(field)))
        return msg

    return build()


def _message_class(parent: Any, field: FieldDescriptor) -> type:
    return message_factory.GetMessageClass(field.message_type)


class Outcomes:
    """Counts of (rpc, status) over a fuzz run, printed as a table."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def add(self, rpc: str, code: str) -> None:
        self.counts[(rpc, code)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def table(self, title: str) -> str:
        rpcs = sorted({r for r, _ in self.counts})
        codes = sorted({c for _, c in self.counts}, key=lambda c: (c != "OK", c))
        width = max(len(r) for r in rpcs) if rpcs else 3
        lines = [f"{title}: {self.total} generated calls",
                 " | ".join([f"{'rpc':<{width}}", *codes]),
                 "-|-".join(["-" * width, *("-" * len(c) for c in codes)])]
        for r in rpcs:
            lines.append(" | ".join([f"{r:<{width}}", *(f"{self.counts[(r, c)]:>{len(c)}}" for c in codes)]))
        return "\n".join(lines)
