"""Environment variables of a coordinator connection, each named once (the coordinator, the sidecar
and operator tools read them)."""

from __future__ import annotations

COORDINATOR = "ROLLMUX_COORDINATOR"
"""Address(es) of the coordinator, ``host:port[,host:port]`` (standbys after the leader)."""

BOOTSTRAP_SECRET = "ROLLMUX_BOOTSTRAP_SECRET"
"""Secret from which node and operator tokens derive (unset: node and operator calls are open)."""

SECRET_FILE = "ROLLMUX_SECRET_FILE"
"""Default for ``--secret-file`` of `rollmux coordinator` and `rollmux sidecar`: a file holding the
bootstrap secret (how the Helm chart mounts it); wins over `BOOTSTRAP_SECRET`."""

TOKEN = "ROLLMUX_TOKEN"
"""Operator token for `rollmux status` and other operator calls."""
