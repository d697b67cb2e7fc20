"""The coordinator's side of RollMux: one process (``rollmux coordinator``) serving every job and node
of a cluster, plus the policy it runs and the tools that run the policy offline.

* :mod:`rollmux.coordinator.policy`: the pure placement policy (Algorithm 1, the intra-group schedule,
  regrouping, the paper's baselines), with its registry, command-line switches and profiler;
* :mod:`rollmux.coordinator.service`: the coordinator process (gRPC servicer, runtime, Redis store);
* :mod:`rollmux.coordinator.sim`: the trace simulator (``rollmux simulate``): the same policy in virtual time;
* :mod:`rollmux.coordinator.place_cli`, :mod:`rollmux.coordinator.placement_run`: ``rollmux place``.

The service and the simulator stand side by side on the policy: neither imports the other.
"""
