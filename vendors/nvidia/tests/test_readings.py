"""What NVML reads from each GPU (memory in use, busy share, power, temperature) reaches the node monitor's HAMi and
HAMi-WebUI families through the real binding and the fake ``libnvidia-ml.so.1``; nonsense and unsupported figures are
left out (unknown), never exported as zero."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hami.testing.readings import scrape

NodeFactory = Callable[..., Any]


def test_nvml_readings_are_exported_in_hami_and_webui_units(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.h100()
    first, second = box["devices"][0], box["devices"][1]
    first.update(memory_used_mib=20480, utilization=37, power_mw=251500, temperature=61)
    node = gpu_node(box)
    got = scrape(node.plugins())
    uuid = first["uuid"]
    assert got["hami_host_gpu_memory_used_bytes"][uuid] == 20480 * 2**20
    assert got["hami_host_gpu_utilization_ratio"][uuid] == 37
    assert got["hami_memory_used"][uuid] == 20480
    assert got["hami_memory_util"][uuid] == round(100 * 20480 / 81559, 1)
    assert got["hami_core_util"][uuid] == 37
    assert got["hami_device_power"][uuid] == 251.5
    assert got["hami_device_temperature"][uuid] == 61
    assert got["hami_vmemory_scaling"][uuid] == 1.0
    assert got["hami_device_hardware_health"][uuid] == 0
    # the second GPU supports no utilization, power or temperature query: unknown, its series absent
    other = second["uuid"]
    assert got["hami_memory_used"][other] == 0  # memory is always readable: zero in use is a reading
    for family in ("hami_core_util", "hami_device_power", "hami_device_temperature"):
        assert other not in got[family], family
    assert other not in got["hami_host_gpu_utilization_ratio"]


def test_nonsense_from_the_driver_is_unknown_not_zero(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.h100()
    bad = box["devices"][0]
    # above the device's memory, a busy share of 4294967295 %, 4.29 MW, 4294967295 °C: what an unsigned -1 reads as
    bad.update(memory_used_mib=10**6, utilization=0xFFFFFFFE, power_mw=0xFFFFFFFF, temperature=0xFFFFFFFF)
    node = gpu_node(box)
    got = scrape(node.plugins())
    uuid = bad["uuid"]
    for family in (
        "hami_memory_used",
        "hami_memory_util",
        "hami_core_util",
        "hami_device_power",
        "hami_device_temperature",
        "hami_host_gpu_memory_used_bytes",
        "hami_host_gpu_utilization_ratio",
    ):
        assert uuid not in got.get(family, {}), family
    assert got["hami_vgpu_count"][uuid] == 10  # what the scheduler knows stays
    assert got["hami_memory_size"][uuid] == 81559


def test_a_node_without_nvml_reads_nothing(gpu_node: NodeFactory, boxes: Any) -> None:
    node = gpu_node(boxes.h100())
    plugins = node.plugins(nvmlLibrary=str(node.root / "missing.so"))
    assert plugins.device_readings("NVIDIA") is None
