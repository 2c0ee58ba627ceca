"""The Moore Threads plugin: the conformance kit, sGPU memory sizes, 16 cores per GPU, whole multi-GPU requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami.errors import ConfigError, RequestError
from hami.model import Container, ContainerRequest, Pod, RegisterFormat
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_mthreads import plugin

MT = "Mthreads"
COUNT, MEMORY, CORES = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


def req(count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind=MT, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int) -> ContainerRequest:
    return req(count, percent=100, cores=16)


REQUESTS = [
    RequestCase(MT, {COUNT: "1"}, whole(1)),
    RequestCase(MT, {COUNT: "1", MEMORY: "8", CORES: "4"}, req(memory=4096, cores=4)),  # 8 × 512 MiB, 4/16
    RequestCase(MT, {COUNT: "1", MEMORY: "96", CORES: "16"}, req(memory=49152, cores=16)),
    RequestCase(MT, {MEMORY: "2"}, req(memory=1024)),
    RequestCase(MT, {CORES: "8"}, req(percent=100, cores=8)),
    RequestCase(MT, {COUNT: "0", MEMORY: "3"}, None),
    # legal memory sizes only
    RequestCase(MT, {COUNT: "1", MEMORY: "3"}, "2, 4, 8, 16, 32, 64, 96"),
    RequestCase(MT, {COUNT: "1", MEMORY: "128"}, "is not an sGPU memory size"),
    RequestCase(MT, {COUNT: "1", MEMORY: "0"}, "is not an sGPU memory size"),
    RequestCase(MT, {COUNT: "1", MEMORY: "4Gi"}, "counts 512 MiB"),
    # cores in sixteenths of a GPU
    RequestCase(MT, {COUNT: "1", MEMORY: "8", CORES: "17"}, "more than 16"),
    RequestCase(MT, {COUNT: "1", CORES: "100"}, "more than 16 sixteenths of a GPU"),
    RequestCase(MT, {COUNT: "1", CORES: "half"}, "counts sixteenths of a GPU"),
    # several GPUs are whole GPUs
    RequestCase(MT, {COUNT: "2"}, whole(2)),
    RequestCase(MT, {COUNT: "2", MEMORY: "192", CORES: "32"}, whole(2)),  # what HAMi's webhook writes
    RequestCase(MT, {COUNT: "4", MEMORY: "8", CORES: "4"}, whole(4)),
    RequestCase(MT, {COUNT: "2", MEMORY: "lots"}, "plain non-negative integer"),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="mthreads", plugin=plugin, requests=REQUESTS)


test_conformance = pytest_suite(make_fixture)


def read(resources: Mapping[str, str], config: Mapping[str, Any] | None = None) -> ContainerRequest | None:
    host = VendorHost.from_plugins({"mthreads": plugin}, config={"mthreads": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return host.container_request(MT, container, Pod(name="p", containers=(container,)))


def test_metadata_is_hami_wiring() -> None:
    (kind,) = plugin.INFO.kinds
    assert kind.common_word == MT
    assert kind.register_format is RegisterFormat.CAPACITY
    assert kind.annotations.node_register is None
    assert kind.resources.memory_unit_mib == 512
    assert (kind.annotations.to_allocate, kind.annotations.allocated) == (
        "hami.io/mthreads-vgpu-devices-to-allocate",
        "hami.io/mthreads-vgpu-devices-allocated",
    )
    assert kind.annotations.selectors() == ("mthreads.ai/use-gpuuuid", "mthreads.ai/nouse-gpuuuid")


@pytest.mark.parametrize("units", plugin.LEGAL_MEMORY_UNITS)
def test_every_legal_memory_size(units: int) -> None:
    assert read({COUNT: "1", MEMORY: str(units)}) == req(memory=units * 512)


def test_illegal_memory_refusal_names_resource_and_lists_sizes() -> None:
    with pytest.raises(RequestError) as err:
        read({MEMORY: "6"})
    assert err.value.resource == MEMORY
    assert "write one of 2, 4, 8, 16, 32, 64, 96 (units of 512 MiB)" in str(err.value)


def test_default_cores_in_gpu_units() -> None:
    assert read({COUNT: "1", MEMORY: "16"}, {"defaultCores": 8}) == req(memory=8192, cores=8)
    with pytest.raises(ConfigError, match="mthreads"):
        read({COUNT: "1"}, {"defaultCores": 17})
