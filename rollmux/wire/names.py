"""The one check of a name that crosses the wire (job, node, GPU type): both servicers use it."""

from __future__ import annotations

from rollmux.wire.errors import InvalidArgumentError

MAX_NAME_LEN = 128
"""Longest job or node name accepted (the coordinator's default `ServiceConfig.max_name_len`)."""


def check_name(value: str, field: str, limit: int = MAX_NAME_LEN) -> str:
    """`value` if it is a usable name: non-empty, at most `limit` printable characters, no spaces.

    Raises:
        InvalidArgumentError: naming `field` and (the start of) the bad value.
    """
    if not value:
        raise InvalidArgumentError(f"{field} is missing: expected a non-empty name")
    # isprintable() refuses every whitespace character except the ASCII space
    if len(value) > limit or not value.isprintable() or " " in value:
        raise InvalidArgumentError(f"{field}={value[:40]!r} is invalid: expected at most {limit} printable "
                                   "characters without spaces")
    return value
