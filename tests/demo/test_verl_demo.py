"""``rollmux demo --verl`` outside a source checkout: a clear error naming the remedy, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.cli import main
from rollmux.demo import verl_cpu


def test_verl_demo_is_listed_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--verl" in capsys.readouterr().out


def test_without_the_harness_it_says_a_source_checkout_is_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(verl_cpu, "HARNESS", tmp_path / "missing")  # as installed from a wheel
    assert main(["demo", "--verl", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err and "scripts/setup.sh --dev" in err
    assert not (tmp_path / "out" / "assets").exists()
