"""The coordinator never imports torch (DESIGN.md dependency rule)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
import rollmux.coordinator
import rollmux.coordinator.service.server, rollmux.wire.client
import rollmux.coordinator.service.cli, rollmux.coordinator.service.status_cli
assert "torch" not in sys.modules
print("ok")
"""


def test_coordinator_imports_without_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
