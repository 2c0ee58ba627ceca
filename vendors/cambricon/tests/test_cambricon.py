"""The Cambricon plugin: the conformance kit, 256 MiB memory units, HAMi's default of whole compute, and a
count required for any MLU request (HAMi v2.10's GenerateResourceRequests)."""

from __future__ import annotations

from collections.abc import Mapping
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
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami_vendor_cambricon import plugin

COUNT, MEMORY, CORES = "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore"


def req(count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind="MLU", count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    RequestCase("MLU", {COUNT: "1"}, req(percent=100, cores=100)),
    RequestCase("MLU", {COUNT: "2"}, req(2, percent=100, cores=100)),
    RequestCase("MLU", {COUNT: "1", MEMORY: "4"}, req(memory=1024, cores=100)),  # 4 × 256 MiB, whole compute
    RequestCase("MLU", {COUNT: "1", MEMORY: "4", CORES: "25"}, req(memory=1024, cores=25)),
    RequestCase("MLU", {MEMORY: "8"}, None),  # HAMi v2.10 reads memory and cores only with a count
    RequestCase("MLU", {CORES: "50"}, None),
    RequestCase("MLU", {COUNT: "1", CORES: "50"}, req(percent=100, cores=50)),
    RequestCase("MLU", {COUNT: "0", MEMORY: "8"}, None),
    RequestCase("MLU", {COUNT: "1", CORES: "150"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    RequestCase("MLU", {COUNT: "1", MEMORY: "1024Mi"}, "counts 256 MiB"),
    RequestCase("MLU", {COUNT: "1.5"}, "plain non-negative integer"),
]


def mlu_nodes() -> list[NodeView]:
    """Two nodes of four MLU370-X8 cards, some already shared."""

    def card(i: int, used: int = 0, mem: int = 0, cores: int = 0) -> DeviceUsage:
        device = Device(id=f"MLU-n-{i}", index=i, count=100, devmem=24576, devcore=100, type="MLU370-X8")
        return DeviceUsage(device=device, used=used, usedmem=mem, usedcores=cores)

    return [
        NodeView(name="idle", devices=[card(i) for i in range(4)]),
        NodeView(name="busy", devices=[card(0, 1, 20480, 50), card(1, 2, 8192, 90), card(2), card(3, 1, 0, 100)]),
    ]


def make_fixture() -> VendorFixture:
    return VendorFixture(
        name="cambricon",
        plugin=plugin,
        config={"cndevLibrary": "/nonexistent/libcndev.so"},  # no driver: cards are known by their names
        requests=REQUESTS,
        nodes={"MLU": mlu_nodes},
        fit_requests={
            "MLU": [
                req(memory=1024, cores=25),
                req(percent=100, cores=100),
                req(2, percent=100, cores=100),
                req(memory=8192, cores=50),
                req(4, percent=100, cores=100),
            ]
        },
        edits=[
            EditCase("MLU", (ContainerDevice(uuid="MLU-n-2", type="MLU", usedmem=1024, usedcores=25),)),
            EditCase("MLU", tuple(ContainerDevice(uuid=f"MLU-n-{i}", type="MLU") for i in (0, 3))),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def read(resources: Mapping[str, str], config: Mapping[str, Any] | None = None) -> ContainerRequest | None:
    plugins = VendorPlugins.from_plugins({"cambricon": plugin}, config={"cambricon": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return plugins.container_request("MLU", container, Pod(name="p", containers=(container,)))


def test_metadata_is_hami_wiring() -> None:
    (kind,) = plugin.INFO.kinds
    assert kind.common_word == "MLU"
    assert kind.register_format is RegisterFormat.CAPACITY
    assert kind.annotations.node_register == "hami.io/node-cambricon-mlu-register"  # this project's, see discovery
    assert kind.capacity_by_cores == "cambricon-mlu"
    assert kind.annotations.node_handshake is None
    assert kind.resources.memory_unit_mib == 256
    assert (kind.annotations.to_allocate, kind.annotations.allocated) == (
        "hami.io/cambricon-mlu-devices-to-allocate",
        "hami.io/cambricon-mlu-devices-allocated",
    )
    assert kind.annotations.selectors() == (
        "cambricon.com/use-gpuuuid",
        "cambricon.com/nouse-gpuuuid",
        "cambricon.com/use-mlutype",
        "cambricon.com/nouse-mlutype",
    )


def test_defaults_are_configurable() -> None:
    assert read({COUNT: "1", MEMORY: "4"}, {"defaultCores": 10}) == req(memory=1024, cores=10)
    assert read({COUNT: "1"}, {"defaultMem": 2048}) == req(memory=2048, cores=100)


def test_refusal_names_resource() -> None:
    with pytest.raises(RequestError) as err:
        read({COUNT: "1", MEMORY: "2Gi"})
    assert err.value.resource == MEMORY


@pytest.mark.parametrize("raw", [{"defaultCores": 101}, {"defaultMem": -1}, {"deviceSplitCount": 4}])
def test_bad_settings_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="cambricon"):
        read({COUNT: "1"}, raw)
