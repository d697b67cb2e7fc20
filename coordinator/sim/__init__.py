"""The trace simulator (``rollmux simulate``): the policy driven by virtual time, never a second
implementation of it. Runs in the caller's process; imports the policy, never the coordinator service.

* :mod:`~rollmux.coordinator.sim.api`: trace rows, per-policy results, the strategy protocol, errors;
* :mod:`~rollmux.coordinator.sim.driver`, :mod:`~rollmux.coordinator.sim.dedicated`: virtual-time replay
  of group placements and of job-level allocations; :mod:`~rollmux.coordinator.sim.runtime`: what a phase
  really takes; :mod:`~rollmux.coordinator.sim.engine`: several policies over one trace;
* :mod:`~rollmux.coordinator.sim.strategies`: the policies it knows by name;
* :mod:`~rollmux.coordinator.sim.trace`, :mod:`~rollmux.coordinator.sim.workload`: trace files and the
  built-in workloads; :mod:`~rollmux.coordinator.sim.experiments`: the paper's experiments;
* :mod:`~rollmux.coordinator.sim.metrics`, :mod:`~rollmux.coordinator.sim.report`,
  :mod:`~rollmux.coordinator.sim.plots`: summaries, the terminal table, figures;
  :mod:`~rollmux.coordinator.sim.cli`: the command.
"""
