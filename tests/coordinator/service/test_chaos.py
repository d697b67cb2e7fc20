"""Chaos, short form of benchmarks/chaos.py (same scenario, rollmux.testing.chaos): a real redis-server, a leader
and a standby coordinator, a real ``rollmux sidecar`` per node, shim-rank and direct jobs; one fault of
every kind (leader SIGKILL + restart, failover to the standby, sidecar SIGKILL + restart, a job process
SIGKILLed mid-phase, Redis restart); then the event log is judged: no two runs on one node at once, no
phase lost, repeated or out of on-policy order, every job slot's last run finished.

The long run is the benchmark: ``ROLLMUX_CHAOS_LONG=1 .venv/bin/python benchmarks/chaos.py --check``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.testing.chaos.faults import FaultKind
from rollmux.testing.chaos.ledger import table
from rollmux.testing.chaos.procs import REDIS_BIN
from rollmux.testing.chaos.scenario import ChaosConfig, run_chaos


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_chaos_every_fault_kind_once(tmp_path: Path) -> None:
    if not Path(REDIS_BIN).exists():
        pytest.skip(f"redis-server not found at {REDIS_BIN}: install redis to run the Redis tests")
    config = ChaosConfig(seed=7, window_s=40.0, max_faults=len(FaultKind), gap_s=(1.5, 2.5), iterations=4)
    result = run_chaos(config, tmp_path)
    v = result.verdict
    print("\n" + table(v))
    assert not v.violations, v.violations
    assert (v.lost, v.repeated, v.out_of_order, v.unclosed) == (0, 0, 0, 0), table(v)
    assert not result.unfinished, f"slots whose last run did not finish: {result.unfinished}"
    assert not result.injector_errors, result.injector_errors
    assert set(v.faults) == {k.value for k in FaultKind}, v.faults  # every kind struck once
    assert not v.unrecovered, table(v)  # a failover nobody took over counts here
    assert sum(r.completed for r in v.runs) >= config.shim_jobs + config.direct_jobs
    assert v.phases_completed >= 3 * config.iterations * (config.shim_jobs + config.direct_jobs)
