"""The coordinator process: the gRPC service every sidecar and operator tool talks to.

* :mod:`~rollmux.coordinator.service.servicer`: the ``rollmux.v1.Coordinator`` servicer (authenticate,
  validate, convert, call the core); :mod:`~rollmux.coordinator.service.validate`,
  :mod:`~rollmux.coordinator.service.auth`: its range and token checks;
* :mod:`~rollmux.coordinator.service.core`: the imperative shell (leadership, load, commit, notify,
  expire, recover) around :mod:`~rollmux.coordinator.service.runtime` (state and transitions, no I/O);
* :mod:`~rollmux.coordinator.service.store`, :mod:`~rollmux.coordinator.service.redis_store`,
  :mod:`~rollmux.coordinator.service.committer`: where the state lives (Redis, or in-process) and the
  one ordered writer;
* :mod:`~rollmux.coordinator.service.server`, :mod:`~rollmux.coordinator.service.cli`: assembling and
  running it (``rollmux coordinator``); :mod:`~rollmux.coordinator.service.event_loop`,
  :mod:`~rollmux.coordinator.service.gc_tuning`: its loop and GC pacing;
* :mod:`~rollmux.coordinator.service.http`, :mod:`~rollmux.coordinator.service.metrics`,
  :mod:`~rollmux.coordinator.service.logs`: probes, Prometheus metrics, JSON logs;
* :mod:`~rollmux.coordinator.service.status_cli`: ``rollmux status``;
  :mod:`~rollmux.coordinator.service.env`: its environment variables.
"""
