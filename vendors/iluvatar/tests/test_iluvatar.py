"""The Iluvatar plugin: the conformance kit, per-chip names, and multi-GPU requests read as whole GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami.errors import ConfigError, RequestError
from hami.model import Container, ContainerRequest, Pod, RegisterFormat
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_iluvatar import plugin

V150 = "BI-V150"
COUNT, MEMORY, CORES = "iluvatar.ai/BI-V150-vgpu", "iluvatar.ai/BI-V150.vMem", "iluvatar.ai/BI-V150.vCore"


def req(
    count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0, kind: str = V150
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int, kind: str = V150) -> ContainerRequest:
    return req(count, percent=100, cores=100, kind=kind)


REQUESTS = [
    RequestCase(V150, {COUNT: "1"}, whole(1)),
    RequestCase(V150, {COUNT: "1", MEMORY: "16", CORES: "50"}, req(memory=4096, cores=50)),  # 16 × 256 MiB
    RequestCase(V150, {MEMORY: "8"}, req(memory=2048)),
    RequestCase(V150, {CORES: "30"}, req(percent=100, cores=30)),
    RequestCase(V150, {COUNT: "0"}, None),
    # several GPUs are whole GPUs, whatever vMem and vCore say
    RequestCase(V150, {COUNT: "2"}, whole(2)),
    RequestCase(V150, {COUNT: "2", MEMORY: "16", CORES: "50"}, whole(2)),
    RequestCase(V150, {COUNT: "3", CORES: "300"}, whole(3)),  # what HAMi's webhook writes
    RequestCase(V150, {COUNT: "2", MEMORY: "4Gi"}, "counts 256 MiB"),
    RequestCase(V150, {COUNT: "2", CORES: "all"}, "plain non-negative integer"),
    RequestCase(V150, {COUNT: "1", CORES: "200"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    RequestCase(V150, {COUNT: "1", MEMORY: "4Gi"}, "counts 256 MiB"),
    RequestCase(
        "MR-V50", {"iluvatar.ai/MR-V50-vgpu": "1", "iluvatar.ai/MR-V50.vMem": "4"}, req(memory=1024, kind="MR-V50")
    ),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="iluvatar", plugin=plugin, requests=REQUESTS)


test_conformance = pytest_suite(make_fixture)


def read(kind: str, resources: Mapping[str, str], config: Mapping[str, Any] | None = None) -> ContainerRequest | None:
    host = VendorHost.from_plugins({"iluvatar": plugin}, config={"iluvatar": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return host.container_request(kind, container, Pod(name="p", containers=(container,)))


@pytest.mark.parametrize("chip", ["MR-V100", "MR-V50", "BI-V150", "BI-V100"])
def test_one_kind_per_chip_with_hami_names(chip: str) -> None:
    kind = plugin.INFO.kind(chip)
    assert kind.register_format is RegisterFormat.LEGACY
    assert kind.resources.all() == (f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem", f"iluvatar.ai/{chip}.vCore")
    assert kind.resources.memory_unit_mib == 256
    keys = kind.annotations
    assert (keys.node_register, keys.node_handshake) == (
        f"hami.io/node-{chip}-register",
        f"hami.io/node-handshake-{chip}",
    )
    assert (keys.to_allocate, keys.allocated) == (
        f"hami.io/{chip}-devices-to-allocate",
        f"hami.io/{chip}-devices-allocated",
    )
    assert keys.selectors() == (f"hami.io/use-{chip}-uuid", f"hami.io/no-use-{chip}-uuid")


def test_chips_do_not_read_each_others_resources() -> None:
    assert read("BI-V100", {COUNT: "1"}) is None


def test_default_memory_applies_to_single_gpus_only() -> None:
    config = {"defaultMem": 4096, "defaultCores": 25}
    assert read(V150, {COUNT: "1"}, config) == req(memory=4096, cores=25)
    assert read(V150, {COUNT: "2"}, config) == whole(2)


def test_multi_gpu_refusal_names_resource() -> None:
    with pytest.raises(RequestError) as err:
        read(V150, {COUNT: "2", CORES: "1.5"})
    assert err.value.resource == CORES


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="iluvatar"):
        read(V150, {COUNT: "1"}, {"defaultMemory": 1})
