"""Fixtures of the end-to-end veRL tests: one workspace per test module, with the harness's tiny assets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))


@pytest.fixture(scope="module")
def verl_workspace(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """(root, assets): a fresh folder for this module's jobs and the tiny model, tokenizer and data
    built in it (no downloads). Fails, not skips, without redis-server: CI must run these."""
    import scenario
    from assets import build

    if not scenario.redis_available():
        pytest.fail("redis-server is missing: run scripts/setup.sh --dev")
    root = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    return root, build(root / "assets")
