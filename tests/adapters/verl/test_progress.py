"""Rollout progress from the veRL trainer loop: reported while the rollout permit covers one node,
withheld (recorded once per rollout) when it covers several, since the adapter cannot follow the
migration directive that the coordinator would answer with after freeing nodes the rollout still uses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollmux.adapters.common import PhaseTracker
from rollmux.adapters.verl.runner import Runner
from rollmux.core.model import Lease, Migration, Phase
from rollmux.shim import env


@dataclass
class FakeGate:
    """Grants every phase at once with a lease on `nodes` (what the shim's PhaseContext carries)."""

    nodes_held: tuple[str, ...]
    held: Any = None

    def enter(self, phase: str, iteration: int) -> Any:
        self.held = Lease(job="j", phase=Phase(phase), iteration=iteration, epoch=1, nodes=self.nodes_held, ttl_s=10)
        return self.held

    def exit(self, handle: Any) -> None:
        self.held = None

    def nodes(self) -> tuple[str, ...]:
        return self.held.nodes if self.held is not None else ()


@dataclass
class FakeHook:
    """Stands in for ``rollmux.runtime_hook``: records the reports, answers `directive`."""

    directive: Migration | None = None
    calls: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, finished: int, total: int) -> Migration | None:
        self.calls.append((finished, total))
        return self.directive


def _runner(nodes: tuple[str, ...], hook: FakeHook) -> Runner:
    gate = FakeGate(nodes)
    return Runner(job="j", tracker=PhaseTracker(gate_for=lambda phase: gate), own=gate,  # type: ignore[arg-type]
                  report=hook)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize(("nodes", "reported"), [(("n1",), [(1, 4), (3, 4)]), (("n1", "n2"), [])],
                         ids=["one-node-rollout-reports", "multi-node-rollout-withholds"])
def test_progress_reaches_the_hook_only_for_a_one_node_rollout(
        nodes: tuple[str, ...], reported: list[tuple[int, int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.EVENT_LOG, str(tmp_path / "events.jsonl"))
    hook = FakeHook()
    r = _runner(nodes, hook)
    r.progress(0, 4)  # before any rollout: nothing to report
    r.tracker.begin("rollout")
    r.progress(1, 4)
    r.progress(3, 4)
    r.tracker.begin("train")
    r.progress(4, 4)  # after the rollout: nothing
    assert hook.calls == reported
    withheld = [e for e in _records(tmp_path / "events.jsonl") if e["event"] == "progress_withheld"]
    assert [(e["iteration"], e["nodes"]) for e in withheld] == ([] if reported else [(0, list(nodes))])


def test_a_directive_to_a_one_node_rollout_is_recorded_and_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.EVENT_LOG, str(tmp_path / "events.jsonl"))
    hook = FakeHook(directive=Migration(job="j", epoch=1, keep_nodes=("n1",), release_nodes=("n2",)))
    r = _runner(("n1",), hook)
    r.tracker.begin("rollout")
    r.progress(3, 4)
    assert r.tracker.current == "rollout"
    assert [(e["event"], e["keep"]) for e in _records(tmp_path / "events.jsonl")] == [("migration_ignored", ["n1"])]
