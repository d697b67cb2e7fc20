"""The patch registry on a fake framework tree, each case in a fresh interpreter: patch before and
after the target imports, patch twice, unpatch restores identity, version guard, missing targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adapters.conftest import make_fake_framework, run_fresh

PATCHER = '''
import sys
from rollmux.adapters.common import Patcher, PatchTarget, is_patched
calls = []
def record(tag):
    def wrapper(wrapped, instance, args, kwargs):
        calls.append((tag, type(instance).__name__ if instance is not None else None, args))
        return wrapped(*args, **kwargs)
    return wrapper
def record_async(tag):
    def wrapper(wrapped, instance, args, kwargs):
        async def run():
            calls.append((tag, type(instance).__name__, args))
            return await wrapped(*args, **kwargs)
        return run()
    return wrapper
def redecorate(f):
    return sys.modules["fakefw.engine"].auto_await(f)  # the module is mid-import here
targets = [
    PatchTarget(module="fakefw.engine", attribute="Sub.step", wrapper=record("step")),
    PatchTarget(module="fakefw.engine", attribute="Base.sync_weights", wrapper=record_async("sync"), inner=True,
                redecorate=redecorate),
    PatchTarget(module="fakefw.engine", attribute="Base.generate", wrapper=record_async("gen")),
    PatchTarget(module="fakefw.engine", attribute="Base.helper", wrapper=record("helper")),
    PatchTarget(module="fakefw.engine", attribute="free", wrapper=record("free")),
]
p = Patcher(adapter="fake", distribution="fakefw", supported=">=1.0,<2", targets=targets, remedy="unset X")
'''


@pytest.mark.parametrize("order", ["patch-then-import", "import-then-patch"])
def test_patch_wraps_defining_class_sync_async_static_and_free_functions(fake_fw: Path, order: str) -> None:
    code = PATCHER + (
        "assert p.patch()\nimport fakefw.engine as e\n" if order == "patch-then-import"
        else "import fakefw.engine as e\nassert p.patch()\n") + '''
import asyncio
assert "step" in vars(e.Base) and is_patched(e.Base.__dict__["step"])  # the defining class, via the MRO
assert e.Sub().step(1) == 2 and e.Base().step(5) == 6
assert e.Sub().sync_weights(4) == 8                     # auto_await facade still runs the coroutine
assert asyncio.run(e.Sub().generate(2)) == 6             # coroutine wrapper awaited
assert e.Base.helper(3) == -3 and e.free(1, b=2) == 3
assert calls == [("step", "Sub", (1,)), ("step", "Base", (5,)), ("sync", "Sub", (4,)), ("gen", "Sub", (2,)),
                 ("helper", None, (3,)), ("free", None, (1,))], calls
print(sorted(p.applied()))
'''
    res = run_fresh(code, path=fake_fw)
    assert res.returncode == 0, res.stderr
    assert "fakefw.engine:free" in res.stdout


def test_patch_twice_is_idempotent_and_unpatch_restores_identity(fake_fw: Path) -> None:
    res = run_fresh(PATCHER + '''
import fakefw.engine as e
before = {k: e.Base.__dict__[k] for k in ("step", "sync_weights", "generate", "helper")}
free = e.free
assert p.patch() is True and p.patch() is False
first = e.Base.__dict__["step"]
p2 = Patcher(adapter="fake", distribution="fakefw", supported=">=1", targets=targets, remedy="r")
p2.patch()                                                   # a second registry does not double-wrap
assert e.Base.__dict__["step"] is first
e.Sub().step(1)
assert len(calls) == 1, calls
p.unpatch(); p.unpatch()
assert {k: e.Base.__dict__[k] for k in before} == before and e.free is free
assert p.applied() == () and not p.active
e.Sub().step(1)
assert len(calls) == 1, "unpatched method still records"
''', path=fake_fw)
    assert res.returncode == 0, res.stderr


def test_unpatch_before_import_leaves_module_untouched(fake_fw: Path) -> None:
    res = run_fresh(PATCHER + '''
p.patch(); p.unpatch()
import fakefw.engine as e
from rollmux.adapters.common.patching import MARKER
assert not hasattr(e.Base.__dict__["step"], MARKER) and "fakefw.engine" not in str(p.applied())
''', path=fake_fw)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(("version", "supported", "needle"), [
    ("2.0.0", ">=1.0,<2", "supports fakefw>=1.0,<2, found 2.0.0"),
    ("0.9.9", ">=1.0,<2", "found 0.9.9"),
], ids=["too-new", "too-old"])
def test_version_guard_refuses_outside_range(tmp_path: Path, version: str, supported: str, needle: str) -> None:
    root = make_fake_framework(tmp_path / "site", version=version)
    res = run_fresh(PATCHER.replace('">=1.0,<2"', repr(supported)) + '''
from rollmux.adapters.common import AdapterError
try:
    p.patch()
except AdapterError as exc:
    print("ERR", exc)
import fakefw.engine as e
assert not p.active and not is_patched(e.Base.__dict__["step"])
''', path=root)
    assert res.returncode == 0, res.stderr
    assert needle in res.stdout and "unset X" in res.stdout


def test_missing_target_is_reported_by_dotted_path_and_fails_the_import(fake_fw: Path) -> None:
    res = run_fresh('''
from rollmux.adapters.common import AdapterError, Patcher, PatchTarget
p = Patcher(adapter="fake", distribution="fakefw", supported=">=1", remedy="unset X", targets=[
    PatchTarget(module="fakefw.engine", attribute="Base.gone", wrapper=lambda w, i, a, k: w(*a, **k)),
    PatchTarget(module="fakefw.engine", attribute="Nope.x", wrapper=lambda w, i, a, k: w(*a, **k), required=False)])
p.patch()
try:
    import fakefw.engine
except AdapterError as exc:
    print("ERR", exc)
''', path=fake_fw)
    assert res.returncode == 0, res.stderr
    assert "ERR RollMux fake adapter: fakefw.engine.Base.gone does not exist in fakefw 1.2.3" in res.stdout
