"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.model import ClusterSpec

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
