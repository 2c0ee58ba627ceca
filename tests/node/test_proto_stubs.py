"""The checked-in kubelet API stubs (device plugin, DRA, plugin registration) are exactly what grpcio-tools generates
from the checked-in `.proto` files, and they carry the kubelet's wire names."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "core" / "src"
PROTOS = {
    "hami/node/proto/deviceplugin.proto": ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py"),
    "hami/dra/proto/dra.proto": ("dra_pb2.py", "dra_pb2.pyi", "dra_pb2_grpc.py"),
    "hami/dra/proto/pluginregistration.proto": (
        "pluginregistration_pb2.py", "pluginregistration_pb2.pyi", "pluginregistration_pb2_grpc.py",
    ),
}  # fmt: skip


@pytest.mark.parametrize("proto", sorted(PROTOS))
def test_generated_stubs_match_the_proto(tmp_path: Path, proto: str) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (the dev group) regenerates the stubs")
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        ["protoc", f"-I{SRC}", f"-I{include}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", str(SRC / proto)]
    )  # fmt: skip
    assert status == 0
    folder = Path(proto).parent
    for name in PROTOS[proto]:
        fresh = (tmp_path / folder / name).read_text()
        checked_in = (SRC / folder / name).read_text()
        diff = "".join(difflib.unified_diff(checked_in.splitlines(True), fresh.splitlines(True), name, "regenerated"))
        assert not diff, f"{name} differs from what grpcio-tools generates; regenerate (see the .proto):\n{diff}"


def test_the_services_have_the_kubelets_wire_names() -> None:
    from hami.node.proto import deviceplugin_pb2 as pb

    services = {s.full_name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer",
        ],
    }  # fmt: skip
    numbers = {f"{m.name}.{f.name}": f.number for m in pb.DESCRIPTOR.message_types_by_name.values() for f in m.fields}
    assert numbers["RegisterRequest.options"] == 4
    assert numbers["Device.topology"] == 3
    assert numbers["ContainerAllocateResponse.cdi_devices"] == 5
    assert numbers["ContainerPreferredAllocationRequest.allocation_size"] == 3


def test_the_dra_services_have_the_kubelets_wire_names() -> None:
    from hami.dra.proto import dra_pb2, pluginregistration_pb2

    services = {
        s.full_name: [m.name for m in s.methods]
        for pb in (dra_pb2, pluginregistration_pb2)
        for s in pb.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
        "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"],
    }
    numbers = {
        f"{m.name}.{f.name}": f.number
        for pb in (dra_pb2, pluginregistration_pb2)
        for m in pb.DESCRIPTOR.message_types_by_name.values()
        for f in m.fields
    }
    assert numbers["Device.cdi_device_ids"] == 4
    assert numbers["Device.share_id"] == 5
    assert numbers["Claim.name"] == 3
    assert numbers["PluginInfo.supported_versions"] == 4
