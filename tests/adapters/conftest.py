"""Helpers for adapter tests: a fake framework tree on disk, and fresh interpreters to import it in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_ENGINE = '''
import asyncio, functools

def auto_await(func):                   # like verl.utils.ray_utils.auto_await: a sync facade
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return asyncio.run(func(*args, **kwargs))
    return wrapper

class Base:
    def step(self, x):
        return x + 1

    @auto_await
    async def sync_weights(self, n):
        await asyncio.sleep(0)
        return n * 2

    async def generate(self, n):
        await asyncio.sleep(0)
        return n * 3

    @staticmethod
    def helper(v):
        return -v

class Sub(Base):
    pass

def free(a, b=1):
    return a + b
'''


def make_fake_framework(root: Path, version: str = "1.2.3") -> Path:
    """``fakefw`` (a package with ``fakefw.engine``) and its distribution metadata under `root`."""
    pkg = root / "fakefw"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(FAKE_ENGINE)
    dist = root / f"fakefw-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakefw\nVersion: {version}\n")
    return root


def run_fresh(code: str, *, path: Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (no ROLLMUX_* variables inherited) with `path` importable."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLMUX_", "VERL_"))}
    e["PYTHONPATH"] = os.pathsep.join(str(p) for p in (path, REPO) if p)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def fake_fw(tmp_path: Path) -> Path:
    return make_fake_framework(tmp_path / "site")
