"""The in-trainer shim: the library behind ``import rollmux`` that runs inside every rank of a job.

Off unless ``ROLLMUX_SIDECAR_SOCKET`` is set (then it imports neither grpc nor torch); opted in, it
attaches the rank to its node's sidecar over the Unix socket (``rollmux.wire.sidecar_client``) and
gates each phase on the job's permit. It never imports the sidecar daemon (``rollmux.sidecar``).

* :mod:`~rollmux.shim.api`: the public calls (``rollmux.init``, ``phase``, ``runtime_hook``,
  ``register_state``, ``shutdown``, ``attach_rank``) and the process's opt-in state;
* :mod:`~rollmux.shim.phases`: entering and leaving a phase; :mod:`~rollmux.shim.pools`: which pool's
  rank owns each phase's permit;
* :mod:`~rollmux.shim.runtime`: the process's records and lease loss; :mod:`~rollmux.shim.transport`: the
  sidecar connection (attach, the Attach-stream watcher, calls, detach);
* :mod:`~rollmux.shim.registration`: ``rollmux.register`` through the sidecar;
  :mod:`~rollmux.shim.relocate`: ``rollmux.relocation`` / ``rollmux.relocate``;
* :mod:`~rollmux.shim.state_cache`: device state parked in host DRAM between phases;
  :mod:`~rollmux.shim.vllm_sleep`: the same for a vLLM engine through its sleep mode;
* :mod:`~rollmux.shim.env`: its environment variables.
"""
