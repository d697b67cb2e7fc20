"""Helpers for tests and benchmarks, apart from the product: nothing in RollMux itself imports them.

* :mod:`rollmux.testing.builders`: builders that keep test tables short (``make_job``);
* :mod:`rollmux.testing.chaos`: the chaos harness (restartable processes, faults, the ledger that judges a run).
"""
