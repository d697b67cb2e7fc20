"""The two protocols' messages, generated from the ``.proto`` files here by ``scripts/gen_proto.sh``.

* ``rollmux_v1.proto`` (:mod:`rollmux_v1_pb2`, :mod:`rollmux_v1_pb2_grpc`): the coordinator protocol, gRPC
  over TCP between the coordinator and sidecars, the Kubernetes scheduler and operator tools;
* ``sidecar_v1.proto`` (:mod:`sidecar_v1_pb2`, :mod:`sidecar_v1_pb2_grpc`): the sidecar protocol, gRPC over
  a node's Unix socket between the sidecar and the ranks' shim.

Only the wire (``rollmux.wire``: the converter and the typed clients) and the two servers use them.
"""
