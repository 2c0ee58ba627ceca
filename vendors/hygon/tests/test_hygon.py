"""The Hygon plugin: the conformance kit and HAMi's shared request rules for DCUs."""

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
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami_vendor_hygon import plugin

COUNT, MEMORY, CORES = "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"


def req(count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind="DCU", count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    RequestCase("DCU", {COUNT: "1"}, req(percent=100, cores=100)),
    RequestCase("DCU", {COUNT: "2", MEMORY: "4000", CORES: "30"}, req(2, memory=4000, cores=30)),
    RequestCase("DCU", {COUNT: "1", MEMORY: "4000"}, req(memory=4000)),
    RequestCase("DCU", {MEMORY: "2000"}, req(memory=2000)),
    RequestCase("DCU", {CORES: "40"}, req(percent=100, cores=40)),
    RequestCase("DCU", {COUNT: "0"}, None),
    RequestCase("DCU", {COUNT: "1", MEMORY: "4Gi"}, "write 4096"),
    RequestCase("DCU", {COUNT: "1", CORES: "101"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    RequestCase("DCU", {COUNT: "-1"}, "plain non-negative integer"),
]


def dcu(node: str, i: int, used: int = 0, usedmem: int = 0, usedcores: int = 0, model: str = "Z100L") -> DeviceUsage:
    device = Device(id=f"DCU-{node}{i}", index=i, count=4, devmem=65536, devcore=100, type=model)
    return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=usedcores)


def dcu_nodes() -> list[NodeView]:
    """An idle four-DCU node, a busy one (both in the bare form this daemon registered before), and a K100 node
    registered as HAMi's DCU plugin and this daemon now write it (`DCU-K100`): the scheduler reads both."""
    return [
        NodeView(name="idle", devices=[dcu("idle", i) for i in range(4)]),
        NodeView(name="busy", devices=[dcu("busy", 0, 3, 49152, 90), dcu("busy", 1, 1, 65536, 100)]),
        NodeView(name="k100", devices=[dcu("k", i, model="DCU-K100") for i in range(2)]),
    ]


_FAKE_NODE: list[Path] = []


def conformance_node() -> Path:
    """A fake hy-smi and sysfs describing DCUs PD0..PD3 for the container-edit checks (written once)."""
    if not _FAKE_NODE:
        directory = Path(tempfile.mkdtemp(prefix="hami-hygon-conformance-"))
        atexit.register(shutil.rmtree, directory, True)
        lines = []
        for i in range(4):
            bdf = f"0000:{0x10 + i:02x}:00.0"
            lines += [f"DCU[{i}]\t\t: PCI Bus: {bdf}", f"DCU[{i}]\t\t: Serial Number: PD{i}",
                      f"DCU[{i}]\t\t: Device ID: 0x55b7", f"DCU[{i}]\t\t: VRAM Total Memory (B): {64 << 30}",
                      f"DCU[{i}]\t\t: VRAM Total Used Memory (B): 0"]  # fmt: skip
            drm = directory / "sys" / "bus" / "pci" / "devices" / bdf / "drm"
            (drm / f"card{i + 1}").mkdir(parents=True)
            (drm / f"renderD{128 + i}").mkdir()
        (directory / "out.txt").write_text("\n".join(lines) + "\n")
        script = directory / "hy-smi"
        script.write_text(f'#!/bin/sh\ncat "{directory / "out.txt"}"\n')
        script.chmod(0o755)
        _FAKE_NODE.append(directory)
    return _FAKE_NODE[0]


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type="DCU", usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))


def make_fixture() -> VendorFixture:
    node = conformance_node()
    return VendorFixture(
        name="hygon",
        plugin=plugin,
        config={
            "rocmSmiLibrary": "/nonexistent/librocm_smi64.so",
            "dmiLibrary": "/nonexistent/libhydmi.so",
            "hySmi": str(node / "hy-smi"),
            "sysfsRoot": str(node / "sys"),
            "vdevDir": str(node / "vdev"),
        },
        requests=REQUESTS,
        nodes={"DCU": dcu_nodes},
        fit_requests={"DCU": [req(memory=8000, cores=25), req(), req(2), req(memory=30000), req(4)]},
        edits=[
            EditCase("DCU", placed(("DCU-PD0", 65536, 100)), pod=EDIT_POD),
            EditCase("DCU", placed(("DCU-PD1", 65536, 100), ("DCU-PD2", 65536, 100)), 1, pod=EDIT_POD),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def plugins(config: Mapping[str, Any] | None = None) -> VendorPlugins:
    return VendorPlugins.from_plugins({"hygon": plugin}, config={"hygon": dict(config or {})})


def test_metadata_is_hami_wiring() -> None:
    (kind,) = plugin.INFO.kinds
    assert kind.common_word == "DCU"
    assert kind.register_format is RegisterFormat.LEGACY
    keys = kind.annotations
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-dcu-register", "hami.io/node-handshake-dcu")
    assert (keys.to_allocate, keys.allocated) == ("hami.io/dcu-devices-to-allocate", "hami.io/dcu-devices-allocated")
    assert keys.selectors() == (
        "hygon.com/use-gpuuuid",
        "hygon.com/nouse-gpuuuid",
        "hygon.com/use-dcutype",
        "hygon.com/nouse-dcutype",
    )


def test_count_under_requests_is_read() -> None:
    container = Container(name="main", requests={COUNT: "1"})
    assert plugins().container_request("DCU", container, Pod(name="p", containers=(container,))) == req(
        percent=100, cores=100
    )


def test_defaults_are_configurable() -> None:
    h = plugins({"defaultMem": 8192, "defaultCores": 20})
    container = Container(name="main", limits={COUNT: "1"})
    assert h.container_request("DCU", container, Pod(name="p", containers=(container,))) == req(memory=8192, cores=20)


def test_refusal_names_resource() -> None:
    container = Container(name="main", limits={COUNT: "1", CORES: "half"})
    with pytest.raises(RequestError) as err:
        plugins().container_request("DCU", container, Pod(name="p", containers=(container,)))
    assert err.value.resource == CORES


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="hygon"):
        plugins({"defaultCores": 200})


def test_type_selectors_are_hamis_substring_rule() -> None:
    h = plugins()
    policy = SchedulingPolicy()
    for selectors, fitting in (
        ({"hygon.com/use-dcutype": "k100"}, ["k100"]),
        ({"hygon.com/nouse-dcutype": "Z100"}, ["k100"]),
        ({"hygon.com/nouse-dcutype": "K100"}, ["idle", "busy"]),
        ({"hygon.com/use-gpuuuid": "DCU-idle2"}, ["idle"]),
        ({"hygon.com/nouse-gpuuuid": "DCU-k0,DCU-k1"}, ["idle", "busy"]),
    ):
        pod = Pod(name="p", annotations=selectors, containers=(Container(name="c"),))
        fits = h.fit_nodes("DCU", pod, [req(memory=1000, cores=10)], dcu_nodes(), policy)
        assert [f.node for f in fits if f.placement] == fitting, selectors
