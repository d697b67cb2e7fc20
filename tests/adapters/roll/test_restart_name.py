"""Which name a restarted ROLL driver registers under (docs/how-to/run-roll.md, "Relocation"): the marker's, for a
relocated self-registered job only. CPU, no ROLL import."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rollmux.adapters.common.relocation import MARKER, write_marker
from rollmux.adapters.roll.relocation import marker_path, restart_name
from rollmux.shim import env

STAMP = "20261206-142500"
"""ROLL's per-run folder below ``output_dir`` (its start time): the marker sits above it."""


def config(tmp_path: Path, kind: str = "file_system") -> SimpleNamespace:
    return SimpleNamespace(checkpoint_config={"type": kind, "output_dir": str(tmp_path / "ckpt" / STAMP)})


CASES = [
    # (marker written (None: none), env, expected name)
    ({"job": "C", "relayed": True}, {}, "C"),
    ({"job": "C", "relayed": True}, {env.JOB: "C"}, "C"),
    ({"job": "C", "relayed": True}, {env.JOB: "D"}, None),  # another job's marker
    ({"job": "C", "relayed": True}, {env.JOB_TOKEN: "t"}, None),  # an operator token: attach with it
    ({"job": "C", "relayed": False}, {}, None),  # operator-registered: its restart keeps its token
    ({"relayed": True}, {}, None),
    (None, {}, None),
]


@pytest.mark.parametrize(("marker", "environ", "expected"), CASES,
                         ids=["relayed", "same-job-env", "other-job-env", "operator-token", "not-relayed",
                              "no-job", "no-marker"])
def test_restart_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: dict | None, environ: dict[str, str],
                      expected: str | None) -> None:
    for k in (env.JOB, env.JOB_TOKEN):
        monkeypatch.delenv(k, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    cfg = config(tmp_path)
    assert marker_path(cfg) == str(tmp_path / "ckpt" / MARKER)
    if marker is not None:
        write_marker(marker_path(cfg), marker)
    assert restart_name(cfg) == expected


def test_no_file_system_checkpoint_has_no_marker_and_no_restart_name(tmp_path: Path) -> None:
    cfg = config(tmp_path, kind="hdfs")
    assert marker_path(cfg) == "" and restart_name(cfg) is None
