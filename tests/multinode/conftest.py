"""Multi-node cases: one real deployment (redis-server, coordinator, a sidecar per node, a raylet per node)
per test module, shared by its cases."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
