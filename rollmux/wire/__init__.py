"""The wire: what the coordinator, the sidecars and operator tools share to talk to each other.

Above `rollmux.core.model` and `rollmux.core.errors`, below everything else (the policy, the coordinator
service, the sidecar, the adapters):

* :mod:`rollmux.wire.client`: the coordinator's client (`CoordinatorClient`, `JobClient`, `NodeSession`);
* :mod:`rollmux.wire.convert`: the only code that turns messages (``rollmux.proto``) into domain types and back;
* :mod:`rollmux.wire.errors`: the errors a call can end in, and how their `ErrorCode` crosses both protocols;
* :mod:`rollmux.wire.auth`: tokens (derivation, metadata); :mod:`rollmux.wire.names`: the one name check;
* :mod:`rollmux.wire.env`: the connection's environment variables.
"""
