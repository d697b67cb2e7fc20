"""The node sidecar: one daemon per node (``rollmux sidecar``; a DaemonSet on Kubernetes).

It holds the node's stream to the coordinator (``rollmux.wire.client``) and serves the node's trainer
ranks on a Unix socket (the sidecar protocol, ``rollmux/proto/sidecar_v1.proto``); a rank's open
``Attach`` stream is its lease. It never imports torch nor creates a CUDA context, and never imports
the shim that runs in the ranks (``rollmux.shim``): the socket is their only contact.

* :mod:`~rollmux.sidecar.agent`: the node agent (rank leases, the coordinator stream, node release);
  its parts :mod:`~rollmux.sidecar.agent_permits` (one permit fanned out to the job's local ranks, the
  GPU memory check), :mod:`~rollmux.sidecar.agent_relocations`, :mod:`~rollmux.sidecar.agent_records`;
* :mod:`~rollmux.sidecar.api`: its two state machines (connection, rank lease) and their records;
* :mod:`~rollmux.sidecar.server`: the socket's gRPC service; :mod:`~rollmux.sidecar.peercred`: the
  socket's front door (peer credentials per connection);
* :mod:`~rollmux.sidecar.gpu`, :mod:`~rollmux.sidecar.proctree`: NVML facts and per-process memory, the
  processes under a rank;
* :mod:`~rollmux.sidecar.cli`: the command; :mod:`~rollmux.sidecar.env`: its environment variables.
"""
