"""The node metrics: HAMi's node-side families from the first scrape, zeros until a reader says otherwise."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from hami.model import ContainerDevice, Device, DeviceReading, NodeInventory
from hami.node.monitor import (
    CONTAINER_FAMILIES,
    DEVICE_FAMILIES,
    WEBUI_CONTAINER_FAMILIES,
    WEBUI_DEVICE_FAMILIES,
    ContainerUsage,
    NodeMonitor,
)
from hami.node.pods import ServedContainer

INVENTORY = {
    "Scripted": NodeInventory(
        kind="Scripted",
        devices=(Device(id="SCR-0", index=0, type="Scripted-X"), Device(id="SCR-1", index=1)),
    )
}
SERVED = [
    ServedContainer(
        "team", "train", "uid-train", "main", 1, "Scripted",
        (ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=3000), ContainerDevice(uuid="SCR-1", type="Scripted")),
    )
]  # fmt: skip


def samples(monitor: NodeMonitor) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(monitor.render().decode()):
        out.setdefault(family.name, {})
        for s in family.samples:
            out[family.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def test_every_family_exists_before_anything_is_discovered_or_served() -> None:
    got = samples(NodeMonitor("node-a", dict, list))
    assert set(got) == set(DEVICE_FAMILIES) | set(CONTAINER_FAMILIES) | set(WEBUI_DEVICE_FAMILIES) | set(
        WEBUI_CONTAINER_FAMILIES
    )
    assert all(values == {} for values in got.values())


def test_devices_and_served_containers_appear_at_zero_with_limits_from_the_placement() -> None:
    got = samples(NodeMonitor("node-a", lambda: INVENTORY, lambda: SERVED))
    device = (("device_index", "0"), ("device_type", "Scripted-X"), ("device_uuid", "SCR-0"), ("node", "node-a"))
    assert got["hami_host_gpu_memory_used_bytes"][device] == 0
    untyped = (("device_index", "1"), ("device_type", "Scripted"), ("device_uuid", "SCR-1"), ("node", "node-a"))
    assert got["hami_host_gpu_utilization_ratio"][untyped] == 0  # a device without a model shows its kind
    first = (
        ("container", "main"),
        ("device_uuid", "SCR-0"),
        ("namespace", "team"),
        ("pod", "train"),
        ("vdevice_index", "0"),
    )
    assert got["hami_vgpu_memory_limit_bytes"][first] == 3000 * 2**20
    assert got["hami_vgpu_memory_used_bytes"][first] == 0
    assert got["hami_container_last_kernel_elapsed_seconds"][first] == 0
    assert len(got["hami_container_device_utilization_ratio"]) == 2


def test_readers_fill_usage_by_pod_uid_and_ratios_are_percent_within_100() -> None:
    def containers() -> Iterable[ContainerUsage]:
        yield ContainerUsage("uid-train", "main", "SCR-0", memory_used_bytes=5, utilization_ratio=1.7,
                             last_kernel_elapsed_seconds=2.5, memory_limit_bytes=7)  # fmt: skip
        yield ContainerUsage("uid-of-another-pod", "main", "SCR-1", memory_used_bytes=99)

    def devices() -> Iterable[DeviceReading]:
        yield DeviceReading(device_uuid="SCR-1", memory_used_bytes=11, utilization_percent=0.0)

    got = samples(
        NodeMonitor("node-a", lambda: INVENTORY, lambda: SERVED, container_usage=containers, device_usage=devices)
    )
    first = (
        ("container", "main"),
        ("device_uuid", "SCR-0"),
        ("namespace", "team"),
        ("pod", "train"),
        ("vdevice_index", "0"),
    )
    second = (
        ("container", "main"),
        ("device_uuid", "SCR-1"),
        ("namespace", "team"),
        ("pod", "train"),
        ("vdevice_index", "1"),
    )
    assert got["hami_vgpu_memory_used_bytes"] == {first: 5, second: 0}  # another pod's usage is not this pod's
    assert got["hami_vgpu_memory_limit_bytes"][first] == 7
    assert got["hami_container_device_utilization_ratio"][first] == 100  # HAMi's unit, clamped
    assert got["hami_container_last_kernel_elapsed_seconds"][first] == 2.5
    device = (("device_index", "1"), ("device_type", "Scripted"), ("device_uuid", "SCR-1"), ("node", "node-a"))
    assert got["hami_host_gpu_memory_used_bytes"][device] == 11
    assert got["hami_host_gpu_utilization_ratio"][device] == 0.0


def test_a_failing_reader_gives_zeros_not_a_failed_scrape() -> None:
    def broken() -> Iterable[ContainerUsage]:
        raise OSError("accounting file unreadable")

    got = samples(NodeMonitor("node-a", lambda: INVENTORY, lambda: SERVED, container_usage=broken))
    assert set(got["hami_vgpu_memory_used_bytes"].values()) == {0}
