"""The patch registry: one :class:`Patcher` per framework adapter, idempotent and reversible.

``patch()`` checks the framework's version once against the range the adapter declares, then
installs a post-import hook per target module; each target is wrapped when its module imports (at
once when it already is). Wrapping resolves the attribute on the class that *defines* it (walking the
MRO, as wrapt's ``resolve_path`` does), so a base-class method is patched once for every subclass,
and keeps the original as ``__wrapped__``. ``unpatch()`` puts every original back and forgets the
hooks; it is a no-op for modules never imported (OpenTelemetry's ``unwrap``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rollmux.adapters.common import hooks
from rollmux.adapters.common.api import AdapterError, PatchTarget

log = logging.getLogger(__name__)

MARKER = "__rollmux_patch__"
"""Attribute set on every installed proxy (its value: the adapter's name)."""


@dataclass(slots=True)
class _Applied:
    owner: Any  # the class (or module) whose __dict__ held the attribute
    name: str  # the attribute's last name
    original: Any  # the raw __dict__ value we replaced
    target: PatchTarget


class Patcher:
    """Patches one framework: version guard, deferred wrapping, unpatch.

    Args:
        adapter: short adapter name for messages and the proxy marker (e.g. "verl").
        distribution: the framework's distribution name for the version check (e.g. "verl").
        supported: PEP 440 specifier of the supported versions, declared once (e.g. ">=0.9,<0.10").
        targets: what to wrap.
        remedy: appended to every error (what the user can do instead).
    """

    def __init__(self, *, adapter: str, distribution: str, supported: str, targets: Sequence[PatchTarget],
                 remedy: str) -> None:
        self.adapter, self.distribution, self.supported = adapter, distribution, supported
        self.targets, self.remedy = tuple(targets), remedy
        self._lock = threading.RLock()
        self._on = False
        self._applied: dict[str, _Applied] = {}  # dotted -> record
        self._hooks: dict[str, hooks.Hook] = {}  # module -> our hook

    # ----------------------------------------------------------------------------------- public
    @property
    def active(self) -> bool:
        """True between :meth:`patch` and :meth:`unpatch`."""
        return self._on

    def applied(self) -> tuple[str, ...]:
        """Dotted names (``module:attribute``) wrapped right now in this process."""
        with self._lock:
            return tuple(self._applied)

    def check_version(self) -> str:
        """The installed framework version, if inside the supported range.

        Raises:
            AdapterError: the framework is not installed, or its version is outside the range.
        """
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        try:
            installed = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise AdapterError(f"RollMux {self.adapter} adapter: {self.distribution} is not installed; "
                               f"{self.remedy}") from None
        if Version(installed) not in SpecifierSet(self.supported):
            raise AdapterError(f"RollMux {self.adapter} adapter supports {self.distribution}{self.supported}, "
                               f"found {installed}: install a supported version (pip install "
                               f"'{self.distribution}{self.supported}') or {self.remedy}")
        return installed

    def patch(self) -> bool:
        """Check the version, then wrap every target now or when its module imports. Idempotent.

        Returns:
            False when already patched (nothing done), True otherwise.

        Raises:
            AdapterError: unsupported version, or a required target is missing in an imported module.
        """
        with self._lock:
            if self._on:
                log.debug("rollmux %s adapter: already patched", self.adapter)
                return False
            self.check_version()
            self._on = True
            modules = dict.fromkeys(t.module for t in self.targets)
            for name in modules:
                self._hooks[name] = functools.partial(self._on_import, name)
        for name, hook in list(self._hooks.items()):
            hooks.when_imported(name, hook)
        return True

    def unpatch(self) -> None:
        """Restore every original and drop the hooks. Idempotent; safe if never patched."""
        with self._lock:
            for name, hook in self._hooks.items():
                hooks.discard(name, hook)
            self._hooks.clear()
            for rec in reversed(list(self._applied.values())):
                setattr(rec.owner, rec.name, rec.original)
            self._applied.clear()
            self._on = False

    # ---------------------------------------------------------------------------------- wrapping
    def _on_import(self, name: str, module: ModuleType) -> None:
        with self._lock:
            if not self._on:
                return
            for target in self.targets:
                if target.module == name and target.dotted not in self._applied:
                    rec = self._wrap(module, target)
                    if rec is not None:
                        self._applied[target.dotted] = rec

    def _wrap(self, module: ModuleType, target: PatchTarget) -> _Applied | None:
        owner, name = self._resolve(module, target)
        if owner is None:
            return None
        raw = owner.__dict__[name]
        if getattr(_unbind(raw), MARKER, None):
            log.debug("rollmux %s adapter: %s already wrapped", self.adapter, target.dotted)
            return None
        setattr(owner, name, _proxy(raw, target, self.adapter, self.remedy))
        return _Applied(owner=owner, name=name, original=raw, target=target)

    def _resolve(self, module: ModuleType, target: PatchTarget) -> tuple[Any, str]:
        """The object whose ``__dict__`` defines the attribute (the defining class via the MRO)."""
        *path, name = target.attribute.split(".")
        obj: Any = module
        for part in path:
            obj = getattr(obj, part, None)
            if obj is None:
                self._missing(target, f"{module.__name__}.{'.'.join(path)}")
                return None, name
        owners = inspect.getmro(obj) if inspect.isclass(obj) else (obj,)
        for owner in owners:
            if name in vars(owner):
                return owner, name
        self._missing(target, f"{module.__name__}.{target.attribute}")
        return None, name

    def _missing(self, target: PatchTarget, dotted: str) -> None:
        if target.required:
            version = _installed(self.distribution)
            raise AdapterError(f"RollMux {self.adapter} adapter: {dotted} does not exist in "
                               f"{self.distribution} {version} (needed to gate {target.dotted}); this "
                               f"version is not supported: install {self.distribution}{self.supported} "
                               f"or {self.remedy}")
        log.debug("rollmux %s adapter: optional target %s absent", self.adapter, dotted)


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _unbind(raw: Any) -> Any:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _proxy(raw: Any, target: PatchTarget, adapter: str, remedy: str) -> Any:
    """The replacement for `raw` (a function, staticmethod or classmethod) calling ``target.wrapper``."""
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    func = _unbind(raw)
    if not callable(func):
        raise AdapterError(f"RollMux {adapter} adapter: {target.dotted} is not callable ({type(func).__name__}); "
                           f"{remedy}")
    inner = getattr(func, "__wrapped__", None) if target.inner else func
    if inner is None:
        raise AdapterError(f"RollMux {adapter} adapter: {target.dotted} is not a decorated function "
                           f"(no __wrapped__); {remedy}")
    method = kind is None and _is_method(func)
    proxy = _async_proxy(inner, target, method) if inspect.iscoroutinefunction(inner) \
        else _sync_proxy(inner, target, method)
    if target.inner:
        assert target.redecorate is not None
        proxy = target.redecorate(proxy)
    setattr(proxy, MARKER, adapter)
    return kind(proxy) if kind is not None else proxy


def _is_method(func: Callable[..., Any]) -> bool:
    params = list(inspect.signature(func).parameters)
    return bool(params) and params[0] in ("self", "cls")


def _split(inner: Callable[..., Any], method: bool, args: tuple[Any, ...]) -> tuple[Any, Callable[..., Any],
                                                                                  tuple[Any, ...]]:
    if method and args:
        instance = args[0]
        return instance, functools.partial(inner, instance), args[1:]
    return None, inner, args


def _sync_proxy(inner: Callable[..., Any], target: PatchTarget, method: bool) -> Callable[..., Any]:
    @functools.wraps(inner)
    def proxy(*args: Any, **kwargs: Any) -> Any:
        instance, bound, rest = _split(inner, method, args)
        return target.wrapper(bound, instance, rest, kwargs)

    return proxy


def _async_proxy(inner: Callable[..., Any], target: PatchTarget, method: bool) -> Callable[..., Any]:
    @functools.wraps(inner)
    async def proxy(*args: Any, **kwargs: Any) -> Any:
        instance, bound, rest = _split(inner, method, args)
        return await target.wrapper(bound, instance, rest, kwargs)

    return proxy


def is_patched(obj: Any) -> bool:
    """True when `obj` (a function or method) is a RollMux proxy."""
    return bool(getattr(_unbind(obj), MARKER, None) or getattr(getattr(obj, "__func__", None), MARKER, None))


def loaded(module: str) -> ModuleType | None:
    """The module if this process imported it (never imports it)."""
    return sys.modules.get(module)
