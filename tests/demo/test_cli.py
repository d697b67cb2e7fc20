"""`rollmux demo` as a command: one flag per demo module, shared options, clear errors before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.cli import build_parser, main
from rollmux.demo.cli import DEMOS


def test_every_demo_module_has_its_flag_and_the_first_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    out = capsys.readouterr().out
    for name in DEMOS:
        assert f"--{name}" in out
    assert "(the default)" in out
    args = build_parser().parse_args(["demo", "--out", "rel"])
    assert not hasattr(args, "demo") or args.demo == next(iter(DEMOS))


def test_bad_knob_is_refused_with_a_remedy_and_nothing_written(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["demo", "--tiny", "--no-live", "--out", str(out), "--solo-iterations", "1"]) == 1
    msg = capsys.readouterr().out
    assert "solo_iterations=1" in msg and "--solo-iterations 2" in msg
    assert not out.exists()
