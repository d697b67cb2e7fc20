"""Post-import hooks keyed on exact module names (our own, after wrapt's ``importer`` design).

:func:`when_imported` runs a hook on a module once it is imported: at once if it already is, else
right after the module's code ran, from a ``sys.meta_path`` finder that wraps the module's loader.
Import order therefore does not matter: a framework's plugin entry point (run while the framework
is only half-imported) can install hooks for modules that import much later, in every process.

A hook that raises makes the import of its module fail (wrapt warns about the same): adapters raise
:class:`~rollmux.adapters.common.api.AdapterError` there on purpose, to stop an unsafe job.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Hook]] = {}  # module name -> hooks still to run at its (next) import


def when_imported(name: str, hook: Hook) -> None:
    """Run ``hook(module)`` once module `name` is imported (now, if it already is).

    Args:
        name: the exact module name, e.g. ``"verl.checkpoint_engine.base"`` (no prefix matching).
        hook: called with the module object; it also runs again if the module is re-imported.
    """
    with _lock:
        module = sys.modules.get(name)
        ready = module is not None and not _initializing(module)
        _hooks.setdefault(name, [])
        if hook not in _hooks[name]:
            _hooks[name].append(hook)
        _install_finder()
    if ready:
        assert module is not None
        hook(module)  # outside the lock, as wrapt does


def discard(name: str, hook: Hook | None = None) -> None:
    """Forget `hook` for module `name` (every hook of it when None). A no-op if none is registered."""
    with _lock:
        if hook is None:
            _hooks.pop(name, None)
        elif hook in _hooks.get(name, []):
            _hooks[name].remove(hook)


def pending(name: str) -> tuple[Hook, ...]:
    """The hooks registered for module `name`."""
    with _lock:
        return tuple(_hooks.get(name, ()))


def _initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _fire(module: ModuleType) -> None:
    with _lock:
        hooks = list(_hooks.get(module.__name__, ()))
    for hook in hooks:
        hook(module)


class _HookedLoader(importlib.abc.Loader):
    """Runs the real loader, puts it back on the module, then fires the module's hooks."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # leave no trace of the wrapper on the module
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and wraps their loaders."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        with _lock:
            if not _hooks.get(fullname):
                return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _HookedLoader(spec.loader)
            return spec
        return None


_finder = _PostImportFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
