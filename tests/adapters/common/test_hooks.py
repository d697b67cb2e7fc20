"""Post-import hooks: fire at once when the module is already imported, else right after its code
runs (from the meta-path finder), only for the exact module name, and can be discarded."""

from __future__ import annotations

from pathlib import Path

from tests.adapters.conftest import run_fresh


def test_hooks_fire_after_import_now_and_only_for_exact_names(fake_fw: Path) -> None:
    res = run_fresh('''
import sys
from rollmux.adapters.common import hooks
seen = []
hooks.when_imported("fakefw.engine", lambda m: seen.append(("engine", hasattr(m, "Base"))))
hooks.when_imported("fakefw", lambda m: seen.append(("pkg", True)))
hooks.when_imported("os", lambda m: seen.append(("os", m.__name__)))   # already imported: fires now
assert seen == [("os", "os")], seen
import fakefw.engine
assert seen[1:] == [("pkg", True), ("engine", True)], seen               # after the module body ran
assert fakefw.engine.__loader__.__class__.__name__ != "_HookedLoader"      # no trace left on the module
def late(m): seen.append(("late", True))
hooks.when_imported("fakefw.engine.sub", late)                            # never imported: never fires
hooks.discard("fakefw.engine.sub", late)
assert hooks.pending("fakefw.engine.sub") == ()
''', path=fake_fw)
    assert res.returncode == 0, res.stderr


def test_hook_error_fails_the_import(fake_fw: Path) -> None:
    res = run_fresh('''
from rollmux.adapters.common import AdapterError, hooks
def boom(m): raise AdapterError("unsupported: unset X")
hooks.when_imported("fakefw.engine", boom)
try:
    import fakefw.engine
except AdapterError as exc:
    print("refused:", exc)
''', path=fake_fw)
    assert res.returncode == 0, res.stderr
    assert "refused: unsupported: unset X" in res.stdout
