"""NVIDIA's request rules and its conformance (metadata and requests; fitting and edits come with NVML)."""

from __future__ import annotations

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.errors import RequestError
from hami.model import Container, ContainerRequest, Device, DeviceUsage, NodeView, Pod
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite

GPU, MEM, PCT, CORES = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"


def want(count: int, memory: int = 0, percentage: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind="NVIDIA", count=count, memory=memory, memory_percentage=percentage, cores=cores)


def gpu_nodes() -> list[NodeView]:
    """A T4/V100 node with some GPUs in use and an idle 8×A100 node."""

    def gpu(node: str, i: int, model: str, memory: int, used: int = 0, usedmem: int = 0, cores: int = 0) -> DeviceUsage:
        device = Device(id=f"GPU-{node}-{i}", index=i, count=10, devmem=memory, devcore=100, type=model, numa=i // 4)
        return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=cores)

    mixed = [
        gpu("mixed", 0, "NVIDIA-Tesla T4", 15360, 2, 12000, 60),
        gpu("mixed", 1, "NVIDIA-Tesla V100", 32768, 1, 4000),
    ]
    return [
        NodeView(name="mixed", devices=mixed),
        NodeView(name="a100", devices=[gpu("a100", i, "NVIDIA-A100", 81920) for i in range(8)]),
    ]


def make_fixture(config: dict[str, object] | None = None) -> VendorFixture:
    return VendorFixture(
        name="nvidia",
        plugin=plugin,
        config=config or {},
        requests=[
            RequestCase("NVIDIA", {GPU: "1", MEM: "3000"}, want(1, 3000)),
            RequestCase("NVIDIA", {GPU: "2", MEM: "3000", CORES: "30"}, want(2, 3000, cores=30)),
            RequestCase("NVIDIA", {GPU: "1", PCT: "50"}, want(1, percentage=50)),
            RequestCase("NVIDIA", {MEM: "1024"}, want(1, 1024)),
            RequestCase("NVIDIA", {GPU: "1"}, want(1, percentage=100, cores=100)),
            RequestCase("NVIDIA", {GPU: "0"}, None),
            RequestCase("NVIDIA", {GPU: "1", MEM: "3Gi"}, "so write 3072"),
            RequestCase("NVIDIA", {GPU: "1", CORES: "150"}, "largest legal value"),
            RequestCase("NVIDIA", {GPU: "1", MEM: "1000", PCT: "20"}, "cannot be combined"),
        ],
        nodes={"NVIDIA": gpu_nodes},
        fit_requests={"NVIDIA": [want(1, 3000, cores=30), want(2, percentage=50), want(1, 20000), want(8)]},
    )


test_conformance = pytest_suite(make_fixture)


def read(resources: dict[str, str], **config: object) -> ContainerRequest | None:
    host = VendorHost.from_plugins({"nvidia": plugin}, config={"nvidia": config})
    pod = Pod(name="p", containers=(Container(name="c", limits=resources),))
    return host.container_request("NVIDIA", pod.containers[0], pod)


def test_count_alone_takes_the_configured_default_memory_and_cores() -> None:
    assert read({GPU: "1"}, defaultMem=4096, defaultCores=20) == want(1, 4096, cores=20)


def test_requests_fall_back_to_resource_requests_when_limits_are_absent() -> None:
    host = VendorHost.from_plugins({"nvidia": plugin})
    container = Container(name="c", requests={GPU: "1", MEM: "2000"})
    assert host.container_request("NVIDIA", container, Pod(name="p", containers=(container,))) == want(1, 2000)


def test_unknown_setting_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"gpuSplit"):
        VendorHost.from_plugins({"nvidia": plugin}, config={"nvidia": {"gpuSplit": 3}})


def test_negative_memory_is_refused() -> None:
    with pytest.raises(RequestError, match=r"nvidia\.com/gpumem"):
        read({GPU: "1", MEM: "-5"})
