"""The kubelet device-plugin API v1beta1: `deviceplugin.proto` and the stubs grpcio-tools generates from it.

`deviceplugin_pb2` (messages, typed by its `.pyi`) and `deviceplugin_pb2_grpc` (service stubs) are generated
and checked in; never edit them by hand. `tests/node/test_proto_stubs.py` regenerates them and fails on any
difference, and the command to regenerate is at the top of the `.proto`.
"""
