"""The node daemon's Prometheus metrics: HAMi v2.10's node-side families, on their own port (HAMi's is 9394).

| family | labels | value |
|---|---|---|
| `hami_host_gpu_memory_used_bytes` | node, device_index, device_uuid, device_type | device memory in use |
| `hami_host_gpu_utilization_ratio` | same | device busy share, percent (0-100, as HAMi) |
| `hami_vgpu_memory_used_bytes` | namespace, pod, container, vdevice_index, device_uuid | container's memory in use |
| `hami_vgpu_memory_limit_bytes` | same | container's memory limit on the device |
| `hami_container_device_utilization_ratio` | same | container's share of the device, percent (0-100) |
| `hami_container_last_kernel_elapsed_seconds` | same | seconds since the container last launched work |

Every family exists from the first scrape. Each discovered device has its series from the start, at zero
until a device-usage reader says otherwise; each container this node served (`hami.node.pods`) has its
series from the moment Allocate served it, its limit taken from the scheduler's placement and its usage
zero until a container-usage reader says otherwise. Series are keyed by the pod's UID and the container's
name, which is also how the container's accounting directory is named, so usage cannot be attributed to
another pod. The `_ratio` families are in percent, HAMi's unit (`cmd/vGPUmonitor/metrics.go` reports NVML's
and the shared region's percentages), clamped to 0-100 (HAMi's monitor can report over 100 %); the readers
give 0-1 shares. HAMi's node families this daemon lacks (no reader feeds them yet):
`hami_host_gpu_memory_controller_utilization_ratio`, `hami_container_device_memory_bytes`,
`hami_vgpu_memory_context_bytes`, `hami_vgpu_memory_module_bytes`, `hami_vgpu_memory_buffer_bytes` and
`hami_mig_device_info`.

The readers are plain callables (`ContainerUsageReader`, `DeviceUsageReader`). The daemon connects the
container reader to the isolation libraries' accounting files (`hami.node.usage.AccountingReader`, through
the host paths the vendors' container edits name); no vendor hook reports whole-device usage yet, so the
`hami_host_gpu_*` values stay zero.

Nothing is stored: each scrape builds the families from the current devices, containers and readings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami.front import MetricsServer
from hami.model import NodeInventory
from hami.node.pods import ServedContainer

__all__ = [
    "CONTAINER_FAMILIES",
    "DEVICE_FAMILIES",
    "ContainerUsage",
    "ContainerUsageReader",
    "DeviceUsage",
    "DeviceUsageReader",
    "NodeMonitor",
]

log = logging.getLogger(__name__)

MiB = 1 << 20
DEVICE_LABELS = ("node", "device_index", "device_uuid", "device_type")
CONTAINER_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
DEVICE_FAMILIES = {
    "hami_host_gpu_memory_used_bytes": "Device memory in use, in bytes",
    "hami_host_gpu_utilization_ratio": "Share of time the device was busy, percent (0-100)",
}
CONTAINER_FAMILIES = {
    "hami_vgpu_memory_used_bytes": "Device memory a container uses, in bytes",
    "hami_vgpu_memory_limit_bytes": "Device memory a container may use, in bytes",
    "hami_container_device_utilization_ratio": "Share of the device a container used, percent (0-100)",
    "hami_container_last_kernel_elapsed_seconds": "Seconds since the container last launched work on the device",
}


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's use of one device, as its isolation library accounts it."""

    pod_uid: str
    container: str
    device_uuid: str
    memory_used_bytes: int = 0
    utilization_ratio: float = 0.0
    last_kernel_elapsed_seconds: float = 0.0
    memory_limit_bytes: int | None = None
    """The limit the library enforces; None to use the scheduler's placement."""


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One physical device's use, as its vendor reports it."""

    device_uuid: str
    memory_used_bytes: int = 0
    utilization_ratio: float = 0.0


ContainerUsageReader = Callable[[], Iterable[ContainerUsage]]
DeviceUsageReader = Callable[[], Iterable[DeviceUsage]]


def _percent(share: float) -> float:
    """A 0-1 share as HAMi's percent, clamped to 0-100."""
    return min(max(share, 0.0), 1.0) * 100


def _read(reader: Callable[[], Iterable[object]] | None, what: str) -> list[object]:
    if reader is None:
        return []
    try:
        return list(reader())
    except Exception:  # a scrape must still answer, with zeros
        log.exception("reading %s failed; reporting zero usage", what)
        return []


class NodeMonitor(Collector):
    """Builds the node-side families at each scrape."""

    def __init__(
        self,
        node: str,
        devices: Callable[[], Mapping[str, NodeInventory]],
        containers: Callable[[], Iterable[ServedContainer]],
        *,
        container_usage: ContainerUsageReader | None = None,
        device_usage: DeviceUsageReader | None = None,
    ) -> None:
        self.node = node
        self.devices = devices
        self.containers = containers
        self.container_usage = container_usage
        self.device_usage = device_usage
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterable[Metric]:
        device = {name: GaugeMetricFamily(name, text, labels=DEVICE_LABELS) for name, text in DEVICE_FAMILIES.items()}
        used = {u.device_uuid: u for u in _read(self.device_usage, "device usage") if isinstance(u, DeviceUsage)}
        for inventory in self.devices().values():
            for d in inventory.devices:
                labels = [self.node, str(d.index), d.id, d.type or inventory.kind]
                sample = used.get(d.id, DeviceUsage(d.id))
                device["hami_host_gpu_memory_used_bytes"].add_metric(labels, max(sample.memory_used_bytes, 0))
                device["hami_host_gpu_utilization_ratio"].add_metric(labels, _percent(sample.utilization_ratio))
        container = {
            name: GaugeMetricFamily(name, text, labels=CONTAINER_LABELS) for name, text in CONTAINER_FAMILIES.items()
        }
        usage = {
            (u.pod_uid, u.container, u.device_uuid): u
            for u in _read(self.container_usage, "container usage")
            if isinstance(u, ContainerUsage)
        }
        for c in self.containers():
            for position, granted in enumerate(c.devices):
                uuid = granted.uuid
                labels = [c.namespace, c.pod, c.container, str(position), uuid]
                u = usage.get((c.pod_uid, c.container, uuid), ContainerUsage(c.pod_uid, c.container, uuid))
                limit = u.memory_limit_bytes if u.memory_limit_bytes is not None else granted.usedmem * MiB
                container["hami_vgpu_memory_used_bytes"].add_metric(labels, max(u.memory_used_bytes, 0))
                container["hami_vgpu_memory_limit_bytes"].add_metric(labels, max(limit, 0))
                container["hami_container_device_utilization_ratio"].add_metric(labels, _percent(u.utilization_ratio))
                container["hami_container_last_kernel_elapsed_seconds"].add_metric(
                    labels, max(u.last_kernel_elapsed_seconds, 0.0)
                )
        yield from device.values()
        yield from container.values()

    def render(self) -> bytes:
        """The Prometheus text format of every family."""
        return generate_latest(self.registry)

    def serve(self, address: tuple[str, int]) -> MetricsServer:
        """Serve the families over HTTP on `address` (port 0 picks one) from a background thread."""
        return MetricsServer(self.render, address, name="node metrics").start()
