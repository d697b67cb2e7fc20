"""Chaos harness: a whole RollMux deployment as real processes, faults injected into it, and the
checks of what the jobs saw. Used by ``benchmarks/chaos.py`` and ``tests/coordinator/service/test_chaos.py``.

* :mod:`rollmux.testing.chaos.procs`: restartable processes: redis-server (append-only file), coordinators
  (leader and standby on one Redis), ``rollmux sidecar`` per node.
* :mod:`rollmux.testing.chaos.rank`: the job processes: a shim rank (``rollmux.phase`` through its node's
  sidecar) or a direct coordinator client; both append one JSON line per phase event.
* :mod:`rollmux.testing.chaos.ledger`: pure checks over those events: mutual exclusion per node, each run's
  phases against the on-policy order, recovery time after each fault.
* :mod:`rollmux.testing.chaos.scenario`: starts it all, keeps every job slot running, injects seeded faults.
"""
