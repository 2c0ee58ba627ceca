"""The node daemon's Prometheus metrics: HAMi v2.10's node-side families and HAMi-WebUI v1.2.0's, on one port
(HAMi's is 9394).

HAMi's node families (`cmd/vGPUmonitor/metrics.go`):

| family | labels | value |
|---|---|---|
| `hami_host_gpu_memory_used_bytes` | node, device_index, device_uuid, device_type | device memory in use |
| `hami_host_gpu_utilization_ratio` | same | device busy share, percent (0-100, as HAMi) |
| `hami_vgpu_memory_used_bytes` | namespace, pod, container, vdevice_index, device_uuid | container's memory in use |
| `hami_vgpu_memory_limit_bytes` | same | container's memory limit on the device |
| `hami_container_device_utilization_ratio` | same | container's share of the device, percent (0-100) |
| `hami_container_last_kernel_elapsed_seconds` | same | seconds since the container last launched work |

HAMi-WebUI's families (`server/internal/exporter/metrics.go` at v1.2.0), which its own exporter computes from
the scheduler's annotations, DCGM and the vendors' exporters, exported here from what this daemon knows, with
WebUI's names, labels and units. Device labels W = node, provider (the kind's common word: `NVIDIA`, `MLU`,
`DCU`...), device_type, device_uuid, driver_version, device_no (the device index); container labels
K = node, provider, device_type, device_uuid, pod_name, container_name, namespace_name.

| family | labels | value |
|---|---|---|
| `hami_vgpu_count` | W | the split count (how many containers may share the device) |
| `hami_vmemory_size`, `hami_memory_size` | W | registered memory, MiB (after memory scaling, as WebUI's `Devmem`) |
| `hami_vcore_size` | W | registered cores (100 per unscaled device) |
| `hami_core_size` | W | 100 |
| `hami_vcore_scaling` | W | registered cores / 100 |
| `hami_vmemory_scaling` | W | registered memory / the device's physical memory |
| `hami_memory_used` | W | device memory in use, MiB |
| `hami_memory_util` | W | device memory in use / registered, percent |
| `hami_core_used`, `hami_core_util` | W | device busy share, percent |
| `hami_device_power` | W | board power, watts |
| `hami_device_temperature`, `hami_device_memory_temperature` | W | degrees Celsius |
| `hami_device_hardware_health` | W | 0 healthy, 1 unhealthy (as discovery reports it) |
| `hami_container_vgpu_allocated` | K + container_pod_uuid (`<container>:<pod uid>`) | devices granted here |
| `hami_container_vmemory_allocated` | same | memory granted, MiB |
| `hami_container_vcore_allocated` | same | cores granted, percent |
| `hami_container_memory_used` | K | memory the container uses, MiB |
| `hami_container_memory_util` | K | memory used / granted, percent |
| `hami_container_core_used` | K | the container's share of the device, percent |
| `hami_container_core_util` | K | that share / the cores granted (100 when the grant sets no core limit), percent |

Every family exists from the first scrape. HAMi's families keep HAMi's behaviour: each discovered device and
each served container has its series from the start, at zero until a reader says otherwise (HAMi's monitor shows
zero too). WebUI's usage families carry only what is known: a device whose vendor gives no reading, a figure the
library cannot give, or one that makes no sense (negative, memory above the device, a busy share above 100 %, a
temperature or power no hardware reaches) leaves its series out, and so does a container whose isolation library
has not accounted anything yet; a value is never made up as zero. In HAMi's `hami_host_gpu_*` a nonsensical
figure is also left out rather than reported.

Series are keyed by the pod's UID and the container's name, which is also how the container's accounting
directory is named, so usage cannot be attributed to another pod. The `_ratio` families are in percent, HAMi's
unit, clamped to 0-100 (HAMi's monitor can report over 100 %); the container readers give 0-1 shares.
HAMi's node families this daemon lacks (no reader feeds them yet):
`hami_host_gpu_memory_controller_utilization_ratio`, `hami_container_device_memory_bytes`,
`hami_vgpu_memory_context_bytes`, `hami_vgpu_memory_module_bytes`, `hami_vgpu_memory_buffer_bytes` and
`hami_mig_device_info`; WebUI's it cannot serve are listed in docs/hami-compatibility.md.

The readers are plain callables (`ContainerUsageReader`, `DeviceReadingReader`). The daemon connects the
container reader to the isolation libraries' accounting files (`hami.node.usage.AccountingReader`, through the
host paths the vendors' container edits name) and the device reader to the vendors' `hami_device_readings`.

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
from hami.model import Device, DeviceReading, NodeInventory
from hami.node.pods import ServedContainer

__all__ = [
    "CONTAINER_FAMILIES",
    "DEVICE_FAMILIES",
    "WEBUI_CONTAINER_FAMILIES",
    "WEBUI_CONTAINER_LABELS",
    "WEBUI_DEVICE_FAMILIES",
    "WEBUI_DEVICE_LABELS",
    "ContainerUsage",
    "ContainerUsageReader",
    "DeviceReadingReader",
    "NodeMonitor",
    "SaneReading",
    "sane_reading",
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
WEBUI_DEVICE_LABELS = ("node", "provider", "device_type", "device_uuid", "driver_version", "device_no")
WEBUI_DEVICE_FAMILIES = {
    "hami_vgpu_count": "Total vGPU count",
    "hami_vmemory_size": "Total vMemory size, MiB",
    "hami_vcore_size": "Total vCore size",
    "hami_vcore_scaling": "GPU virtual core Scaling",
    "hami_vmemory_scaling": "GPU virtual memory Scaling",
    "hami_memory_size": "Actual memory size, unit is 'MB'",
    "hami_memory_used": "Actual memory usage, unit is 'MB'",
    "hami_memory_util": "Actual Memory Util percent 0-100",
    "hami_core_size": "Actual core size",
    "hami_core_used": "Actual Core Used",
    "hami_core_util": "Actual Core Util percent 0-100",
    "hami_device_temperature": "gpu temperature, degrees Celsius",
    "hami_device_memory_temperature": "gpu memory temperature, degrees Celsius",
    "hami_device_power": "gpu power, watts",
    "hami_device_hardware_health": "gpu hardware health: 0 healthy, 1 unhealthy",
}
WEBUI_ALLOCATED_LABELS = (
    "node", "provider", "device_type", "device_uuid", "pod_name", "container_name", "namespace_name",
    "container_pod_uuid",
)  # fmt: skip
WEBUI_CONTAINER_LABELS = WEBUI_ALLOCATED_LABELS[:-1]
WEBUI_CONTAINER_FAMILIES = {
    "hami_container_vgpu_allocated": "task allocated vGPU count",
    "hami_container_vmemory_allocated": "task allocated vMemory size, MiB",
    "hami_container_vcore_allocated": "task allocated vCore size",
    "hami_container_memory_used": "task used memory unit MB",
    "hami_container_memory_util": "task memory util percent 0-100",
    "hami_container_core_used": "task used core, percent of the device",
    "hami_container_core_util": "task core util percent 0-100",
}
_ALLOCATED = ("hami_container_vgpu_allocated", "hami_container_vmemory_allocated", "hami_container_vcore_allocated")

MAX_POWER_WATTS = 5000.0
"""Above any accelerator board's draw (the largest are about 1.5 kW): a reading beyond is not a power."""
TEMPERATURE_RANGE = (-40.0, 150.0)
"""Where a working chip's sensor can read; beyond (e.g. an unsigned -1, 4294967295) is not a temperature."""


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
class SaneReading:
    """A `DeviceReading` with every figure that makes no sense for its device replaced by None (unknown)."""

    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_percent: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    driver_version: str = ""


ContainerUsageReader = Callable[[], Iterable[ContainerUsage]]
DeviceReadingReader = Callable[[], Iterable[DeviceReading]]


def _within(value: float | None, low: float, high: float) -> float | None:
    if value is None or value != value or not low <= value <= high:  # NaN compares false everywhere
        return None
    return value


def sane_reading(reading: DeviceReading | None, device: Device) -> SaneReading:
    """`reading` checked against `device`: a negative figure, memory in use above the device's memory (physical
    when the reading gives it, else registered), a busy share outside 0-100 %, a power above `MAX_POWER_WATTS` or
    a temperature outside `TEMPERATURE_RANGE` becomes None. No reading: everything unknown."""
    if reading is None:
        return SaneReading()
    total = reading.memory_total_bytes if reading.memory_total_bytes and reading.memory_total_bytes > 0 else None
    ceiling = total if total is not None else (device.devmem * MiB if device.devmem else None)
    used = reading.memory_used_bytes
    if used is not None and (used < 0 or (ceiling is not None and used > ceiling)):
        used = None
    return SaneReading(
        memory_used_bytes=used,
        memory_total_bytes=total,
        utilization_percent=_within(reading.utilization_percent, 0.0, 100.0),
        power_watts=_within(reading.power_watts, 0.0, MAX_POWER_WATTS),
        temperature_celsius=_within(reading.temperature_celsius, *TEMPERATURE_RANGE),
        memory_temperature_celsius=_within(reading.memory_temperature_celsius, *TEMPERATURE_RANGE),
        driver_version=reading.driver_version,
    )


def _percent(share: float) -> float:
    """A 0-1 share as HAMi's percent, clamped to 0-100."""
    return min(max(share, 0.0), 1.0) * 100


def _read(reader: Callable[[], Iterable[object]] | None, what: str) -> list[object]:
    if reader is None:
        return []
    try:
        return list(reader())
    except Exception:  # a scrape must still answer, with what it knows
        log.exception("reading %s failed; reporting no usage this scrape", what)
        return []


def _families(spec: Mapping[str, str], labels: Iterable[str]) -> dict[str, GaugeMetricFamily]:
    return {name: GaugeMetricFamily(name, text, labels=list(labels)) for name, text in spec.items()}


class NodeMonitor(Collector):
    """Builds the node-side families at each scrape."""

    def __init__(
        self,
        node: str,
        devices: Callable[[], Mapping[str, NodeInventory]],
        containers: Callable[[], Iterable[ServedContainer]],
        *,
        container_usage: ContainerUsageReader | None = None,
        device_usage: DeviceReadingReader | None = None,
    ) -> None:
        self.node = node
        self.devices = devices
        self.containers = containers
        self.container_usage = container_usage
        self.device_usage = device_usage
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterable[Metric]:
        host = _families(DEVICE_FAMILIES, DEVICE_LABELS)
        webui = _families(WEBUI_DEVICE_FAMILIES, WEBUI_DEVICE_LABELS)
        readings = {
            r.device_uuid: r for r in _read(self.device_usage, "device readings") if isinstance(r, DeviceReading)
        }
        known: dict[str, tuple[str, Device]] = {}
        for inventory in self.devices().values():
            for d in inventory.devices:
                known.setdefault(d.id, (inventory.kind, d))
                self._device(host, webui, inventory.kind, d, readings.get(d.id), reported=bool(readings))
        hami = _families(CONTAINER_FAMILIES, CONTAINER_LABELS)
        allocated = _families({k: WEBUI_CONTAINER_FAMILIES[k] for k in _ALLOCATED}, WEBUI_ALLOCATED_LABELS)
        used = _families(
            {k: v for k, v in WEBUI_CONTAINER_FAMILIES.items() if k not in _ALLOCATED}, WEBUI_CONTAINER_LABELS
        )
        usage = {
            (u.pod_uid, u.container, u.device_uuid): u
            for u in _read(self.container_usage, "container usage")
            if isinstance(u, ContainerUsage)
        }
        for c in self.containers():
            grants: dict[str, list[int]] = {}
            for position, granted in enumerate(c.devices):
                uuid = granted.uuid
                labels = [c.namespace, c.pod, c.container, str(position), uuid]
                u = usage.get((c.pod_uid, c.container, uuid), ContainerUsage(c.pod_uid, c.container, uuid))
                limit = u.memory_limit_bytes if u.memory_limit_bytes is not None else granted.usedmem * MiB
                hami["hami_vgpu_memory_used_bytes"].add_metric(labels, max(u.memory_used_bytes, 0))
                hami["hami_vgpu_memory_limit_bytes"].add_metric(labels, max(limit, 0))
                hami["hami_container_device_utilization_ratio"].add_metric(labels, _percent(u.utilization_ratio))
                hami["hami_container_last_kernel_elapsed_seconds"].add_metric(
                    labels, max(u.last_kernel_elapsed_seconds, 0.0)
                )
                total = grants.setdefault(uuid, [0, 0, 0])
                total[0] += 1
                total[1] += granted.usedmem
                total[2] += granted.usedcores
            for uuid, (count, memory, cores) in grants.items():
                kind, device = known.get(uuid, (c.kind, None))
                device_type = (device.type if device is not None else "") or kind
                base = [self.node, kind, device_type, uuid, c.pod, c.container, c.namespace]
                for name, value in zip(_ALLOCATED, (count, memory, cores), strict=True):
                    allocated[name].add_metric([*base, f"{c.container}:{c.pod_uid}"], value)
                measured = usage.get((c.pod_uid, c.container, uuid))
                if measured is None:  # nothing accounted yet: unknown, not zero
                    continue
                memory_mib = max(measured.memory_used_bytes, 0) / MiB
                share = _percent(measured.utilization_ratio)
                used["hami_container_memory_used"].add_metric(base, memory_mib)
                if memory > 0:
                    used["hami_container_memory_util"].add_metric(base, round(100 * memory_mib / memory, 1))
                used["hami_container_core_used"].add_metric(base, share)
                used["hami_container_core_util"].add_metric(base, round(100 * share / (cores or 100), 1))
        yield from host.values()
        yield from hami.values()
        yield from webui.values()
        yield from allocated.values()
        yield from used.values()

    def _device(
        self,
        host: Mapping[str, GaugeMetricFamily],
        webui: Mapping[str, GaugeMetricFamily],
        kind: str,
        d: Device,
        reading: DeviceReading | None,
        *,
        reported: bool,
    ) -> None:
        sane = sane_reading(reading, d)
        device_type = d.type or kind
        labels = [self.node, str(d.index), d.id, device_type]
        # HAMi's families: zero while no vendor reports (as HAMi's monitor); a nonsensical figure left out
        if sane.memory_used_bytes is not None or not reported:
            host["hami_host_gpu_memory_used_bytes"].add_metric(labels, sane.memory_used_bytes or 0)
        if sane.utilization_percent is not None or not reported:
            host["hami_host_gpu_utilization_ratio"].add_metric(labels, sane.utilization_percent or 0.0)
        w = [self.node, kind, device_type, d.id, sane.driver_version, str(d.index)]
        webui["hami_vgpu_count"].add_metric(w, d.count)
        webui["hami_vmemory_size"].add_metric(w, d.devmem)
        webui["hami_vcore_size"].add_metric(w, d.devcore)
        webui["hami_vcore_scaling"].add_metric(w, d.devcore / 100)
        webui["hami_memory_size"].add_metric(w, d.devmem)
        webui["hami_core_size"].add_metric(w, 100)
        webui["hami_device_hardware_health"].add_metric(w, 0 if d.health else 1)
        if sane.memory_total_bytes:
            webui["hami_vmemory_scaling"].add_metric(w, round(d.devmem * MiB / sane.memory_total_bytes, 1))
        if sane.memory_used_bytes is not None:
            mib = sane.memory_used_bytes / MiB
            webui["hami_memory_used"].add_metric(w, mib)
            if d.devmem:
                webui["hami_memory_util"].add_metric(w, round(100 * mib / d.devmem, 1))
        if sane.utilization_percent is not None:
            webui["hami_core_used"].add_metric(w, sane.utilization_percent)
            webui["hami_core_util"].add_metric(w, sane.utilization_percent)
        for name, value in (
            ("hami_device_power", sane.power_watts),
            ("hami_device_temperature", sane.temperature_celsius),
            ("hami_device_memory_temperature", sane.memory_temperature_celsius),
        ):
            if value is not None:
                webui[name].add_metric(w, value)

    def render(self) -> bytes:
        """The Prometheus text format of every family."""
        return generate_latest(self.registry)

    def serve(self, address: tuple[str, int]) -> MetricsServer:
        """Serve the families over HTTP on `address` (port 0 picks one) from a background thread."""
        return MetricsServer(self.render, address, name="node metrics").start()
