"""RollMux demos: a whole RollMux setup on one machine, as real processes, with a live view.

``rollmux demo`` runs one of them (see :mod:`rollmux.demo.cli`):

* :mod:`rollmux.demo.tiny` (default): three tiny GRPO jobs (:mod:`rollmux.demo.tiny_grpo`, shipped in
  the package) multiplexed over a rollout core and a training core of this machine's CPUs.

Shared parts: :mod:`rollmux.demo.launch` starts the embedded coordinator, the sidecars and the job
processes; :mod:`rollmux.demo.report` turns the shim's phase records into checks, figures and a Gantt
chart; :mod:`rollmux.demo.view` renders the live view and the summary table.
"""
