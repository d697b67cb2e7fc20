"""veRL plugin entry point (``verl.plugins`` group; also ``VERL_USE_EXTERNAL_MODULES``).

veRL imports this module in every process that imports ``verl``, while ``verl`` is only
half-imported, and calls nothing in it (``entry_point.load()`` only imports), so importing it is
what loads the adapter. Not opted in (``ROLLMUX_SIDECAR_SOCKET`` unset): it returns at once and
imports nothing else. Opted in: it checks the veRL version and installs post-import hooks; patches
apply when their target modules import. veRL swallows exceptions from entry points, so a refusal
(unsupported version) is re-raised from the import of veRL's trainer modules instead, which stops
the job before any worker or GPU is touched.
"""

from __future__ import annotations

import sys

from rollmux.adapters.common.registration import opted_in

_patcher = None


def patcher():  # type: ignore[no-untyped-def]
    """The adapter's :class:`~rollmux.adapters.common.Patcher` (built on first use)."""
    global _patcher
    if _patcher is None:
        from rollmux.adapters.common import Patcher
        from rollmux.adapters.verl import targets

        _patcher = Patcher(adapter="verl", distribution="verl", supported=targets.SUPPORTED,
                           targets=targets.targets(), on_applied=_on_applied,
                           remedy="unset ROLLMUX_SIDECAR_SOCKET to run this job without RollMux")
    return _patcher


def _on_applied(module: str, dotted: tuple[str, ...]) -> None:
    from rollmux.adapters.verl import runner

    runner.record("patched", module=module, targets=list(dotted), argv0=sys.argv[0] if sys.argv else "")


REFUSE_ON = ("verl.trainer.constants_ppo", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.ray_trainer",
             "verl.checkpoint_engine.base")
"""Modules whose import fails when the adapter refused to patch (every veRL trainer imports them)."""


def load() -> bool:
    """Load the adapter in this process. Idempotent.

    Returns:
        True when opted in and patching (now or at import), False when RollMux is off.

    Raises:
        AdapterError: opted in with an unsupported veRL (also raised again from veRL's trainer imports).
    """
    if not opted_in():
        return False
    from rollmux.adapters.common import AdapterError, hooks
    from rollmux.adapters.verl import sync_backend

    try:
        patcher().patch()
    except AdapterError as exc:
        print(f"[rollmux] {exc}", file=sys.stderr)

        def refuse(module: object, error: AdapterError = exc) -> None:
            raise error

        for name in REFUSE_ON:
            hooks.when_imported(name, refuse)
        raise
    sync_backend.install()  # the `rollmux` checkpoint-engine backend
    return True


def unpatch() -> None:
    """Undo every patch in this process (tests)."""
    if _patcher is not None:
        _patcher.unpatch()


if opted_in():
    load()
