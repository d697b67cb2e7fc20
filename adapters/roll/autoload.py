"""Imported by ``rollmux-roll.pth`` at interpreter start, only when ``ROLLMUX_SIDECAR_SOCKET`` is set.

Nothing ROLL is imported here: the ROLL hooks (:func:`rollmux.adapters.roll.patch`) are installed
when ``roll`` itself is first imported, so processes that never import ROLL pay nothing and the
version guard runs where it can stop the job: an unsupported ROLL makes ``import roll`` fail with
the reason (a job never runs unscheduled on shared GPUs).
"""

from __future__ import annotations

from types import ModuleType

from rollmux.adapters.common import hooks
from rollmux.adapters.common.registration import opted_in


def _on_roll(_module: ModuleType) -> None:
    from rollmux.adapters.roll import patch

    patch()


if opted_in():
    hooks.when_imported("roll", _on_roll)
