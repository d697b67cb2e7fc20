"""Environment variables of the two connections, each named once: the coordinator's (the coordinator,
the sidecar and operator tools read them) and the sidecar socket's (the sidecar and the shim read it)."""

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

SIDECAR_SOCKET = "ROLLMUX_SIDECAR_SOCKET"
"""Opt-in. Path of the node sidecar's Unix-domain socket the trainer ranks attach to
(e.g. ``/run/rollmux/sidecar.sock``). Unset: RollMux is off and the shim does nothing."""
