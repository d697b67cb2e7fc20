"""The ROLL rollout gate reports progress only while its rollout permit covers one node, as the veRL
adapter does: a multi-node rollout's progress is withheld (recorded once per rollout), since ROLL cannot
move its requests off nodes the coordinator would free on a migration. The shim is replaced by a fake
that grants every phase at once with a lease on the given nodes (no sidecar here)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollmux.adapters.roll.gate import PoolGate
from rollmux.core.model import Lease, Phase
from rollmux.shim import api as shim
from rollmux.shim import env


@dataclass
class FakeShim:
    """``init`` / ``phase`` / ``runtime_hook`` of the shim: phases granted on `nodes`, reports recorded."""

    nodes: tuple[str, ...]
    reports: list[tuple[int, int]] = field(default_factory=list)

    def install(self, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(shim, "init", lambda **_: True)
        mp.setattr(shim, "phase", self.phase)
        mp.setattr(shim, "runtime_hook", self.hook)

    def phase(self, name: str, *, iteration: int | None = None) -> Any:
        nodes = self.nodes

        class Ctx:
            def __enter__(self) -> Any:
                lease = Lease(job="j", phase=Phase(name), iteration=iteration or 0, epoch=1, nodes=nodes, ttl_s=10)
                return type("Held", (), {"lease": lease})()

            def __exit__(self, *exc: Any) -> None:
                return None

        return Ctx()

    def hook(self, finished: int, total: int) -> None:
        self.reports.append((finished, total))


@pytest.mark.parametrize(("nodes", "reported"), [(("r0",), [(1, 4), (4, 4), (4, 4), (2, 4)]), (("r0", "r1"), [])],
                         ids=["one-node-rollout-reports", "multi-node-rollout-withholds"])
def test_rollout_progress_is_withheld_while_the_permit_covers_several_nodes(
        nodes: tuple[str, ...], reported: list[tuple[int, int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.EVENT_LOG, str(tmp_path / "events.jsonl"))
    fake = FakeShim(nodes)
    fake.install(monkeypatch)
    gate = PoolGate(socket="unused", job="j", token="t", rank=0, permit_timeout_s=None, deployment="disaggregated")
    for it in range(2):
        gate.enter("rollout", it)
        gate.progress(1 + 3 * it, 4)
        gate.progress(4 - 2 * it, 4)
        gate.exit()
    assert fake.reports == reported
    path = tmp_path / "events.jsonl"
    withheld = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert [(e["event"], e["iteration"], e["nodes"]) for e in withheld] == (
        [] if reported else [("progress_withheld", 0, list(nodes)), ("progress_withheld", 1, list(nodes))])
