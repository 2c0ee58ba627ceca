"""HAMi-WebUI v1.2.0 on this project's metrics: every family WebUI reads whose meaning this project has, scraped over
HTTP from the node daemon's monitor and the scheduler, with the label set WebUI's exporter declares
(`server/internal/exporter/metrics.go`) and HAMi v2.10's quota families (`cmd/scheduler/metrics.go`).

The label sets below are written from those sources, not imported from the code under test, so a renamed label
fails here."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.model import ContainerDevice, Device, DeviceReading, NodeInventory
from hami.node.monitor import ContainerUsage, NodeMonitor
from hami.node.pods import ServedContainer

WEBUI_DEVICE = {"node", "provider", "device_type", "device_uuid", "driver_version", "device_no"}
WEBUI_TASK = {"node", "provider", "device_type", "device_uuid", "pod_name", "container_name", "namespace_name"}
WEBUI_TASK_ALLOCATED = WEBUI_TASK | {"container_pod_uuid"}

NODE_FAMILIES = {
    "hami_vgpu_count": WEBUI_DEVICE,
    "hami_vmemory_size": WEBUI_DEVICE,
    "hami_vcore_size": WEBUI_DEVICE,
    "hami_vcore_scaling": WEBUI_DEVICE,
    "hami_vmemory_scaling": WEBUI_DEVICE,
    "hami_core_size": WEBUI_DEVICE,
    "hami_memory_size": WEBUI_DEVICE,
    "hami_memory_used": WEBUI_DEVICE,
    "hami_memory_util": WEBUI_DEVICE,
    "hami_core_used": WEBUI_DEVICE,
    "hami_core_util": WEBUI_DEVICE,
    "hami_device_temperature": WEBUI_DEVICE,
    "hami_device_memory_temperature": WEBUI_DEVICE,
    "hami_device_power": WEBUI_DEVICE,
    "hami_device_hardware_health": WEBUI_DEVICE,
    "hami_container_vgpu_allocated": WEBUI_TASK_ALLOCATED,
    "hami_container_vmemory_allocated": WEBUI_TASK_ALLOCATED,
    "hami_container_vcore_allocated": WEBUI_TASK_ALLOCATED,
    "hami_container_memory_used": WEBUI_TASK,
    "hami_container_memory_util": WEBUI_TASK,
    "hami_container_core_used": WEBUI_TASK,
    "hami_container_core_util": WEBUI_TASK,
    # WebUI reads these two of HAMi's node families directly (exporter.go's task queries)
    "hami_container_device_utilization_ratio": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_vgpu_memory_used_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
}
SCHEDULER_FAMILIES = {
    "hami_resource_quota_used": {"namespace", "quota_name", "limit"},
    "hami_resource_quota_limit": {"namespace", "quota_name"},
}
MIB = 2**20


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        out[family.name] += [(dict(s.labels), s.value) for s in family.samples]
    return out


def assert_label_sets(got: dict[str, list[tuple[dict[str, str], float]]], families: dict[str, set[str]]) -> None:
    """Every family has series, each with exactly the family's label names."""
    for family, labels in families.items():
        assert got.get(family), f"{family} has no series"
        for series_labels, _ in got[family]:
            assert set(series_labels) == labels, family


def one(series: Iterable[tuple[dict[str, str], float]], **labels: str) -> float:
    found = [v for got, v in series if all(got.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, (labels, found)
    return found[0]


def test_the_node_daemon_serves_every_webui_family_with_webui_labels_and_units() -> None:
    inventory = {
        "NVIDIA": NodeInventory(
            kind="NVIDIA",
            devices=(
                Device(id="GPU-a", index=0, type="NVIDIA-A100", devmem=40960, devcore=100, count=10),
                Device(id="GPU-b", index=1, type="NVIDIA-A100", devmem=40960, devcore=200, count=10, health=False),
            ),
        )
    }
    served = [
        ServedContainer(
            "team", "train", "uid-1", "main", 0, "NVIDIA",
            (ContainerDevice(uuid="GPU-a", type="NVIDIA", usedmem=8192, usedcores=25),),
        )
    ]  # fmt: skip
    readings = [
        DeviceReading(
            device_uuid="GPU-a", memory_used_bytes=10240 * MIB, memory_total_bytes=40960 * MIB,
            utilization_percent=42, power_watts=250.5, temperature_celsius=55, memory_temperature_celsius=60,
            driver_version="550.54.15",
        ),
        DeviceReading(device_uuid="GPU-b", memory_used_bytes=-5, utilization_percent=250, temperature_celsius=9999),
    ]  # fmt: skip
    usage = [ContainerUsage("uid-1", "main", "GPU-a", memory_used_bytes=2048 * MIB, utilization_ratio=0.2)]
    monitor = NodeMonitor(
        "node-a", lambda: inventory, lambda: served, container_usage=lambda: usage, device_usage=lambda: readings
    )
    server = monitor.serve(("127.0.0.1", 0))
    try:
        got = scrape(server.port)
    finally:
        server.stop()
    assert_label_sets(got, NODE_FAMILIES)
    a = {"node": "node-a", "provider": "NVIDIA", "device_type": "NVIDIA-A100", "device_uuid": "GPU-a"}
    assert one(got["hami_vgpu_count"], **a) == 10
    assert one(got["hami_memory_size"], **a) == 40960  # MiB, as WebUI's Devmem
    assert one(got["hami_memory_used"], **a, driver_version="550.54.15", device_no="0") == 10240
    assert one(got["hami_memory_util"], **a) == 25.0
    assert one(got["hami_core_util"], **a) == 42
    assert one(got["hami_core_size"], **a) == 100
    assert one(got["hami_device_power"], **a) == 250.5
    assert one(got["hami_device_temperature"], **a) == 55
    assert one(got["hami_device_memory_temperature"], **a) == 60
    assert one(got["hami_device_hardware_health"], **a) == 0
    b = {**a, "device_uuid": "GPU-b"}
    assert one(got["hami_vcore_scaling"], **b) == 2.0
    assert one(got["hami_device_hardware_health"], **b) == 1
    for unknown in ("hami_memory_used", "hami_core_util", "hami_device_temperature"):  # nonsense: no series
        assert not [s for s, _ in got[unknown] if s["device_uuid"] == "GPU-b"], unknown
    task = {**a, "pod_name": "train", "container_name": "main", "namespace_name": "team"}
    assert one(got["hami_container_vgpu_allocated"], **task, container_pod_uuid="main:uid-1") == 1
    assert one(got["hami_container_vmemory_allocated"], **task) == 8192
    assert one(got["hami_container_vcore_allocated"], **task) == 25
    assert one(got["hami_container_memory_used"], **task) == 2048
    assert one(got["hami_container_memory_util"], **task) == 25.0
    assert one(got["hami_container_core_used"], **task) == 20.0
    assert one(got["hami_container_core_util"], **task) == 80.0  # 20 % of the device against a 25 % grant


def test_the_scheduler_serves_hamis_quota_families_with_hamis_labels(harness: Harness) -> None:
    harness.cluster.create(
        "resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "150"}},
        },
    )
    harness.add_node(gpu_node("node-a", gpus=2))
    harness.add_pod(gpu_pod("p1", mem=6000))
    harness.start()
    assert harness.schedule("p1") == "node-a"
    harness.flush()
    assert harness.service is not None
    server = harness.service.metrics.serve_metrics(("127.0.0.1", 0))
    try:
        got = scrape(server.port)
    finally:
        server.stop()
    assert_label_sets(got, SCHEDULER_FAMILIES)
    memory = {"namespace": "default", "quota_name": "nvidia.com/gpumem"}
    assert one(got["hami_resource_quota_limit"], **memory) == 8000
    assert one(got["hami_resource_quota_used"], **memory, limit="8000") == 6000
    cores = {"namespace": "default", "quota_name": "nvidia.com/gpucores"}
    assert one(got["hami_resource_quota_limit"], **cores) == 150
