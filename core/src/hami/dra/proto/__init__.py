"""The kubelet's DRA plugin API v1 (`dra.proto`) and plugin registration API v1 (`pluginregistration.proto`), with
the stubs grpcio-tools generates from them.

The `*_pb2` (messages, typed by their `.pyi`) and `*_pb2_grpc` (service stubs) modules are generated and
checked in; never edit them by hand. `tests/node/test_proto_stubs.py` regenerates them and fails on any
difference, and the command to regenerate is at the top of `dra.proto`.
"""
