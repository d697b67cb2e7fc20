"""The root of RollMux's exception hierarchy.

Each subsystem declares its own errors in its ``api.py`` and roots them here, so a caller can
catch ``RollMuxError`` at a process or RPC boundary and let everything else (bugs) propagate.
"""

from __future__ import annotations


class RollMuxError(Exception):
    """Base class of every error RollMux raises on purpose."""


class SpecError(RollMuxError, ValueError):
    """A user-supplied specification (job, node, catalog, trace row) is invalid.

    The message names the field, the offending value and the allowed range.
    """
