"""The MetaX plugin: the conformance kit, whole and shared cards, GiB memory, the sGPU pod annotations and HAMi's
admission default."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hami.errors import ConfigError, RequestError
from hami.model import (
    AdmissionEdit,
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami_vendor_metax import plugin

GPU, SGPU = "Metax-GPU", "Metax-SGPU"
WHOLE = "metax-tech.com/gpu"
COUNT, MEMORY, CORES = "metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"
QOS, APP = "metax-tech.com/sgpu-qos-policy", "metax-tech.com/sgpu-app-class"


def req(
    count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0, kind: str = SGPU
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    # whole cards
    RequestCase(GPU, {WHOLE: "1"}, req(percent=100, cores=100, kind=GPU)),
    RequestCase(GPU, {WHOLE: "4"}, req(4, percent=100, cores=100, kind=GPU)),
    RequestCase(GPU, {WHOLE: "0"}, None),
    RequestCase(GPU, {WHOLE: "one"}, "plain non-negative integer"),
    # shared cards, memory in GiB, whole compute unless vcore says otherwise
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100)),
    RequestCase(SGPU, {COUNT: "1", MEMORY: "8"}, req(memory=8192, cores=100)),
    RequestCase(SGPU, {COUNT: "2", MEMORY: "8", CORES: "30"}, req(2, memory=8192, cores=30)),
    RequestCase(SGPU, {CORES: "50"}, req(percent=100, cores=50)),
    RequestCase(SGPU, {COUNT: "1", MEMORY: "8Gi"}, "counts 1024 MiB"),
    RequestCase(SGPU, {COUNT: "1", CORES: "120"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    # QoS policy and app class
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "fixed-share"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "burst-share"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "best-effort"}),
    RequestCase(SGPU, {COUNT: "1"}, "best-effort, fixed-share, burst-share", {QOS: "guaranteed"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {APP: "online", QOS: "ignored-when-online"}),
    RequestCase(SGPU, {COUNT: "1"}, "online, offline", {APP: "batch"}),
    RequestCase(SGPU, {COUNT: "2"}, "single-device", {APP: "offline"}),
    RequestCase(GPU, {WHOLE: "1"}, req(percent=100, cores=100, kind=GPU), {QOS: "guaranteed"}),
]


def sgpu_nodes() -> list[NodeView]:
    """An idle four-card node and a busy one."""

    def card(node: str, i: int, used: int = 0, mem: int = 0, cores: int = 0) -> DeviceUsage:
        device = Device(
            id=f"GPU-{node}{i}",
            index=i,
            count=16,
            devmem=65536,
            devcore=100,
            type=SGPU,
            custom={"QosPolicy": "", "Model": "MXC500", "LinkZone": 1 + i // 2},
        )
        return DeviceUsage(device=device, used=used, usedmem=mem, usedcores=cores)

    return [
        NodeView(name="idle", devices=[card("idle", i) for i in range(4)]),
        NodeView(name="busy", devices=[card("busy", 0, 3, 49152, 90), card("busy", 1, 1, 65536, 100)]),
    ]


def gpu_nodes() -> list[NodeView]:
    def card(node: str, i: int, used: int = 0) -> DeviceUsage:
        device = Device(id=f"GPU-{node}{i}", index=i, count=1, devmem=65536, devcore=100, type="MXC500")
        return DeviceUsage(device=device, used=used, usedmem=65536 * used, usedcores=100 * used)

    return [NodeView(name="w", devices=[card("w", i) for i in range(4)]), NodeView(name="x", devices=[card("x", 0, 1)])]


_FAKE_NODE: list[Path] = []


def conformance_node() -> Path:
    """A fake mx-smi and sysfs describing cards GPU-PD0..GPU-PD3 for the container-edit checks (written once)."""
    if not _FAKE_NODE:
        directory = Path(tempfile.mkdtemp(prefix="hami-metax-conformance-"))
        atexit.register(shutil.rmtree, directory, True)
        listing, table = [], []
        for i in range(4):
            bdf = f"0000:{0x10 + i:02x}:00.0"
            listing.append(f"GPU#{i}    MXC500      {bdf}   Available (UUID: GPU-PD{i})")
            table += [f"| {i}  MetaX C500 | {bdf} | 0% |", "| 36C 56W / 350W | 0/65536 MiB | Available |"]
            drm = directory / "sys" / "bus" / "pci" / "devices" / bdf / "drm"
            (drm / f"card{i + 1}").mkdir(parents=True)
            (drm / f"renderD{128 + i}").mkdir()
        (directory / "list.txt").write_text("\n".join(listing) + "\n")
        (directory / "table.txt").write_text("\n".join(table) + "\n")
        script = directory / "mx-smi"
        script.write_text(
            f'#!/bin/sh\nif [ "$*" = "-L" ]; then cat "{directory / "list.txt"}"; '
            f'else cat "{directory / "table.txt"}"; fi\n'
        )
        script.chmod(0o755)
        _FAKE_NODE.append(directory)
    return _FAKE_NODE[0]


def placed(kind: str, *devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type=kind, usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))


def make_fixture() -> VendorFixture:
    node = conformance_node()
    return VendorFixture(
        name="metax",
        plugin=plugin,
        config={
            "mxsmlLibrary": "/nonexistent/libmxsml.so",
            "mxSmi": str(node / "mx-smi"),
            "sysfsRoot": str(node / "sys"),
            "hookPath": str(node / "hook"),
        },
        requests=REQUESTS,
        nodes={SGPU: sgpu_nodes, GPU: gpu_nodes},
        fit_requests={
            SGPU: [req(memory=8192, cores=25), req(percent=100, cores=100), req(2, memory=4096, cores=10)],
            GPU: [req(percent=100, cores=100, kind=GPU), req(2, percent=100, cores=100, kind=GPU)],
        },
        edits=[
            EditCase(SGPU, placed(SGPU, ("GPU-PD0", 8192, 30)), pod=EDIT_POD),
            EditCase(GPU, placed(GPU, ("GPU-PD1", 65536, 100), ("GPU-PD2", 65536, 100)), 1, pod=EDIT_POD),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def read(
    kind: str,
    resources: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> ContainerRequest | None:
    plugins = VendorPlugins.from_plugins({"metax": plugin}, config={"metax": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return plugins.container_request(
        kind, container, Pod(name="p", annotations=dict(annotations or {}), containers=(container,))
    )


def test_metadata_is_hami_wiring() -> None:
    gpu, sgpu = plugin.INFO.kinds
    assert (gpu.common_word, sgpu.common_word) == (GPU, SGPU)
    assert gpu.resources.all() == (WHOLE,)
    assert sgpu.resources.all() == (COUNT, MEMORY, CORES)
    assert sgpu.resources.memory_unit_mib == 1024
    # whole cards: HAMi counts them from capacity as <node>-metax-<i>; shared cards: MetaX's node annotation
    assert gpu.register_format is RegisterFormat.CAPACITY
    assert gpu.capacity_name == "metax"
    assert sgpu.annotations.node_register == "metax-tech.com/node-gpu-devices"
    assert plugin.INFO.isolation_library == "libvmaca.so"
    for kind, word in ((gpu, "gpu"), (sgpu, "sgpu")):
        assert (kind.annotations.to_allocate, kind.annotations.allocated) == (
            f"hami.io/metax-{word}-devices-to-allocate",
            f"hami.io/metax-{word}-devices-allocated",
        )
        assert kind.annotations.selectors() == ("metax-tech.com/use-gpuuuid", "metax-tech.com/nouse-gpuuuid")


def test_qos_refusal_names_annotation() -> None:
    with pytest.raises(RequestError) as err:
        read(SGPU, {COUNT: "1"}, {QOS: "Fixed-Share"})
    assert err.value.resource == QOS


def test_annotations_do_not_matter_without_a_request() -> None:
    assert read(SGPU, {COUNT: "0"}, {QOS: "guaranteed"}) is None


def test_defaults_apply_to_shared_cards_only() -> None:
    config = {"defaultMem": 4096, "defaultCores": 40}
    assert read(SGPU, {COUNT: "1"}, config=config) == req(memory=4096, cores=40)
    assert read(GPU, {WHOLE: "1"}, config=config) == req(percent=100, cores=100, kind=GPU)


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="metax"):
        read(SGPU, {COUNT: "1"}, config={"sgpuQosPolicy": "x"})


def test_admission_writes_best_effort_where_no_policy_is_named() -> None:
    plugins = VendorPlugins.from_plugins({"metax": plugin})
    container = Container(name="main", limits={COUNT: "1"})

    def defaults(annotations: dict[str, str]) -> AdmissionEdit | None:
        return plugins.admission_defaults(
            SGPU, container, Pod(name="p", annotations=annotations, containers=(container,))
        )

    assert defaults({}) == AdmissionEdit(pod_annotations={QOS: "best-effort"})
    assert defaults({QOS: "burst-share"}) is None
    assert defaults({APP: "online"}) is None


def test_capacity_nodes_are_named_as_hami_names_them() -> None:
    """A node served by MetaX's own gpu-device plugin has only capacity: this scheduler reads it as HAMi does."""
    from hami.scheduler.state import ClusterState

    state = ClusterState(VendorPlugins.from_plugins({"metax": plugin}))
    node = {"metadata": {"name": "w1", "annotations": {}}, "status": {"capacity": {WHOLE: "2"}}}
    devices = state.reader.devices_of(node, plugin.GPU)
    assert [d.id for d in devices] == ["w1-metax-0", "w1-metax-1"]
    entry = '[{"uuid":"GPU-a","totalDevCount":4,"totalCompute":100,"totalVRam":32768,"healthy":true,"linkZone":2}]'
    sgpu = {"metadata": {"name": "w2", "annotations": {"metax-tech.com/node-gpu-devices": entry}}}
    (device,) = state.reader.devices_of(sgpu, plugin.SGPU)
    assert (device.id, device.count, device.devmem, device.custom["LinkZone"]) == ("GPU-a", 4, 32768, 2)
