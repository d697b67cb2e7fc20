"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmux.core.model import ClusterSpec
from rollmux.testing.chaos.procs import REDIS_BIN, RedisProcess

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def cluster() -> ClusterSpec:
    return ClusterSpec()


@pytest.fixture
def shared_dir() -> Path:
    """The workplace's shared/ folder (trace data); tests that need it skip without it."""
    if not SHARED.exists():
        pytest.skip(f"shared data folder {SHARED} is not present")
    return SHARED


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A real redis-server (append-only file) on a free port, restartable on its data dir."""
    if not Path(REDIS_BIN).exists():
        pytest.skip(f"redis-server not found at {REDIS_BIN}: install redis to run the Redis tests")
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()
