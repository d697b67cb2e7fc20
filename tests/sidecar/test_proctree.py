"""The process tree under a job's ranks, read from a real ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollmux.sidecar.proctree import parent_pids, with_descendants

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs")

TREE = r"""
import subprocess, sys, time
# a child that starts a grandchild, then prints both pids
GRAND = "import time; time.sleep(60)"
CHILD = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', %r]); "
         "print(g.pid, flush=True); time.sleep(60)") % GRAND
c = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
print(c.pid, c.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_descendants_of_a_rank_map_to_it_and_others_do_not() -> None:
    rank = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = map(int, rank.stdout.readline().split())  # type: ignore[union-attr]
        owner = with_descendants([rank.pid])
        assert owner[rank.pid] == rank.pid and owner[child] == rank.pid and owner[grandchild] == rank.pid
        assert os.getpid() not in owner  # the rank's parent is not below it
        assert with_descendants([child]) == {child: child, grandchild: child}
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(rank.pid)], check=False)
        rank.kill()
        rank.wait()


def test_a_gone_rank_is_kept_and_parent_links_parse_odd_names(tmp_path: Path) -> None:
    for pid, stat in ((10, "10 (a) b) S 1 10"), (11, "11 (x y) S 10 11"), (12, "12 (z) S 11 12")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    assert parent_pids(str(tmp_path)) == {10: 1, 11: 10, 12: 11}
    assert with_descendants([10, 99], str(tmp_path)) == {10: 10, 11: 10, 12: 10, 99: 99}
    assert parent_pids(str(tmp_path / "absent")) == {}
