"""The `verl.plugins` entry point (pyproject): until the veRL adapter lands, refuse to run opted in.

veRL loads this in every process that imports it. Without the opt-in (`ROLLMUX_SIDECAR_SOCKET`
unset) it does nothing and imports nothing. With the opt-in set it raises, because an opted-in job
that ran unscheduled on shared GPUs would be worse than one that does not start.
"""

from __future__ import annotations

import os

from rollmux.errors import RollMuxError
from rollmux.sidecar.env import SIDECAR_SOCKET


class VerlAdapterUnavailableError(RollMuxError, RuntimeError):
    """The job opted in to RollMux but this rollmux version cannot gate veRL's phases yet."""


def load() -> None:
    """Entry point of the `verl.plugins` group.

    Raises:
        VerlAdapterUnavailableError: the opt-in variable is set.
    """
    socket = os.environ.get(SIDECAR_SOCKET)
    if not socket:
        return
    raise VerlAdapterUnavailableError(
        f"{SIDECAR_SOCKET}={socket!r} opts this veRL job in to RollMux, but this rollmux version has no "
        "veRL adapter yet, so the job would run unscheduled on shared GPUs; unset "
        f"{SIDECAR_SOCKET} to run it unmultiplexed, or install a rollmux release with the veRL adapter")
