"""Environment variables of the coordinator service, each named once (the connection's own, shared
with the sidecar and operator tools, are in `rollmux.wire.env`)."""

from __future__ import annotations

REDIS_URL = "ROLLMUX_REDIS_URL"
"""Default for `rollmux coordinator --redis`."""
