"""The scheduler's Prometheus metrics: HAMi v2.10's scheduler-side families and the extender's own.

Owns what the scheduler exports on its metrics port (HAMi's is 9395) and how each value is computed.
Nothing here is stored: at every scrape a collector reads `ClusterState` under its lock, copies the
numbers it needs and builds the families outside the lock, so a scrape never holds up a filter for long
and never shows a value that the state does not have. Every node's devices appear from the moment the node
registers them, with zero usage, so dashboards are never empty before the first pod (a common complaint
about HAMi's monitor).

HAMi's families (protocol.md section 7), all with the const label `zone="vGPU"`, for every device kind
(`device_type` is the device's model as registered, e.g. `NVIDIA-A100`, `DCU-Z100`; the kind's common word
for kinds registered from node capacity). Labels: D = node, device_uuid, device_index, device_type;
C = namespace, node, pod, container_index, device_uuid.

| family | labels | value |
|---|---|---|
| `hami_gpu_memory_limit_bytes` | D | registered memory, MiB × 2^20 |
| `hami_gpu_core_limit_ratio` | D | registered cores, percent (100 = one whole device) |
| `hami_gpu_memory_allocated_bytes` | D + device_cores | memory granted, bytes |
| `hami_gpu_core_allocated_ratio` | D | cores granted, percent |
| `hami_gpu_shared_count` | D | containers sharing the device |
| `hami_node_gpu_overview` | D + device_cores, device_memory_limit | memory granted, bytes |
| `hami_node_gpu_memory_allocated_ratio` | D | memory granted / registered (0-1, as HAMi) |
| `hami_vgpu_memory_allocated_bytes` | C | one container's memory, bytes |
| `hami_vgpu_core_allocated_ratio` | C | one container's cores, percent |

Label choices, as HAMi v2.10 has them: `device_cores` is the device's registered cores (`devcore`, 100 per
unscaled device) and `device_memory_limit` its registered memory in MiB, both as decimal strings;
`hami_node_gpu_overview` carries them so one series describes a device; `hami_node_gpu_memory_allocated_ratio`
is left out for a device that registers no memory (HAMi does the same rather than divide by zero).
`container_index` is the container's position in the pod's `…-devices-allocated` annotation: init containers
first, then app containers (protocol.md section 3). Pods count from the moment the filter records them.

Units are HAMi's (`cmd/scheduler/metrics.go` at v2.10.0), whatever the names say, so HAMi's Grafana
dashboards read these series unchanged: the core families are in percent (a whole device is 100, a device with
core scaling shows a limit above 100, and `allocated / limit` is its share in use), the memory ratio is 0-1.
HAMi rescales the core values of devices whose type starts with `AMD` (compute units to percent); no vendor
here registers such devices, and core holds no vendor names, so that rule is not carried.

Namespace quotas (`hami.quota`), as HAMi v2.10 writes them (without the zone label), one series per namespace
and device resource a ResourceQuota limits (`quota_name` is the resource, e.g. `nvidia.com/gpumem`; memory in
MiB, cores in percent, the limit the smallest of the namespace's quota objects):

| family | labels | value |
|---|---|---|
| `hami_resource_quota_used` | namespace, quota_name, limit (the limit as a decimal string) | used by live pods |
| `hami_resource_quota_limit` | namespace, quota_name | the limit |

Absent until the feature it describes exists: `hami_node_gpu_mig_instance_info` (node, device_uuid,
device_index, mig_name; needs MIG instance tracking).

The extender's own, without the zone label:

- `hami_scheduler_filter_seconds`, `hami_scheduler_prioritize_seconds`, `hami_scheduler_bind_seconds`:
  histograms of the time each verb took in the HTTP app (`observe`, which `ExtenderApp(observe=...)` calls);
- `hami_scheduler_node_lock_wait_seconds`: histogram of the time bind waited for a node lock;
- `hami_scheduler_filter_outcomes_total{result}`: filter answers by `placed`, `unschedulable`, `error`,
  `passthrough`, all four present from the start;
- `hami_scheduler_leader`: 1 while this replica leads (see `hami.scheduler.leader`), else 0;
- `hami_scheduler_placement_mismatches_total`: pod annotations found to differ from the placement the
  scheduler signed, or a signature that no longer verifies (`hami.signing`; each change counted once);
- `hami_scheduler_requeues_total`: pods asked to retry because they were refused from a view that missed a
  capacity free kube-scheduler had already seen (`hami.scheduler.requeue`);
- `hami_scheduler_preemptions_total{result}`: preemptions by `evicted`, `dry_run`, `refused`, `failed`
  (`hami.scheduler.preempting`), and `hami_scheduler_preemption_victims_total`: the pods they evicted.

`render()` gives the Prometheus text format; `serve_metrics(address)` serves `GET /metrics` on a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hami.front import MetricsServer
from hami.plugins import VendorPlugins
from hami.quota import QuotaLedger
from hami.scheduler.extender import FilterResult
from hami.scheduler.preempting import PREEMPTION_RESULTS
from hami.scheduler.state import ClusterState

__all__ = [
    "ABSENT_FAMILIES",
    "FILTER_OUTCOMES",
    "LATENCY_BUCKETS",
    "MetricsServer",
    "SchedulerMetrics",
    "ZONE",
    "filter_outcome",
]

log = logging.getLogger(__name__)

ZONE: Final = "vGPU"
MIB: Final = 1 << 20
LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""From 100 µs (a filter on a small cluster) to 10 s (a bind that waited out its node lock)."""
FILTER_OUTCOMES: Final = ("placed", "unschedulable", "error", "passthrough")
ABSENT_FAMILIES: Final = ("hami_node_gpu_mig_instance_info",)
"""HAMi v2.10 families this scheduler does not export yet (no MIG instance tracking)."""

_DEVICE = ("zone", "node", "device_uuid", "device_index", "device_type")
_DEVICE_CORES = ("zone", "node", "device_uuid", "device_index", "device_cores", "device_type")
_OVERVIEW = ("zone", "node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type")
_CONTAINER = ("zone", "namespace", "node", "pod", "container_index", "device_uuid")

_FAMILIES: Final = {
    "memory_limit": ("hami_gpu_memory_limit_bytes", "Device memory registered for a device, in bytes", _DEVICE),
    "core_limit": (
        "hami_gpu_core_limit_ratio",
        "Device cores registered for a device, percent (100 = one device)",
        _DEVICE,
    ),
    "memory_allocated": (
        "hami_gpu_memory_allocated_bytes",
        "Device memory granted to pods on a device, in bytes",
        _DEVICE_CORES,
    ),
    "core_allocated": (
        "hami_gpu_core_allocated_ratio",
        "Device cores granted to pods on a device, percent (100 = one whole device)",
        _DEVICE,
    ),
    "shared": ("hami_gpu_shared_count", "Number of containers sharing a device", _DEVICE),
    "overview": (
        "hami_node_gpu_overview",
        "A device of a node with its limits; the value is memory granted, bytes",
        _OVERVIEW,
    ),
    "memory_ratio": (
        "hami_node_gpu_memory_allocated_ratio",
        "Share of a device's memory granted to pods (0-1)",
        _DEVICE,
    ),
    "vgpu_memory": (
        "hami_vgpu_memory_allocated_bytes",
        "Device memory granted to one container, in bytes",
        _CONTAINER,
    ),
    "vgpu_cores": (
        "hami_vgpu_core_allocated_ratio",
        "Device cores granted to one container, percent (100 = one whole device)",
        _CONTAINER,
    ),
}
"""HAMi's scheduler-side families: key → (name, help, label names), in exposition order."""


def filter_outcome(result: FilterResult) -> str:
    """The outcome label of one filter answer: one of `FILTER_OUTCOMES`."""
    if result.error:
        return "error"
    if result.passthrough:
        return "passthrough"
    return "placed" if result.node else "unschedulable"


@dataclass(frozen=True, slots=True)
class _DeviceRow:
    node: str
    uuid: str
    index: int
    type: str
    devmem: int
    devcore: int
    used: int
    usedmem: int
    usedcores: int


@dataclass(frozen=True, slots=True)
class _ContainerRow:
    namespace: str
    node: str
    pod: str
    container_index: int
    uuid: str
    usedmem: int
    usedcores: int


class _StateCollector(Collector):
    """HAMi's scheduler-side families, computed from `ClusterState` at scrape time."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def _snapshot(self) -> tuple[list[_DeviceRow], list[_ContainerRow]]:
        devices: list[_DeviceRow] = []
        containers: list[_ContainerRow] = []
        seen: set[tuple[str, str]] = set()
        with self.state.lock:
            for node_name, record in self.state.nodes.items():
                for kind, view in record.views.items():
                    for u in view.devices:
                        d = u.device
                        if (node_name, d.id) in seen:  # two kinds registering one device: report it once
                            continue
                        seen.add((node_name, d.id))
                        devices.append(
                            _DeviceRow(
                                node_name,
                                d.id,
                                d.index,
                                d.type or kind,
                                d.devmem,
                                d.devcore,
                                u.used,
                                u.usedmem,
                                u.usedcores,
                            )
                        )
            for key, pod in self.state.pods.items():
                namespace, _, name = key.partition("/")
                for placements in pod.allocation.values():
                    for index, placement in enumerate(placements):
                        containers.extend(
                            _ContainerRow(namespace, pod.node, name, index, d.uuid, d.usedmem, d.usedcores)
                            for d in placement
                            if d.uuid
                        )
        # sorted outside the lock: a stable exposition order costs the filter nothing
        devices.sort(key=lambda r: (r.node, r.index, r.uuid))
        containers.sort(key=lambda r: (r.namespace, r.pod, r.container_index, r.uuid))
        return devices, containers

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            key: GaugeMetricFamily(name, documentation, labels=labels)
            for key, (name, documentation, labels) in _FAMILIES.items()
        }

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def _by_family(self) -> Iterator[tuple[str, Iterator[tuple[Sequence[str], float]]]]:
        """Each family's key, in `_FAMILIES`' order, with its series (label values in the family's label order,
        value), all from one snapshot of the state."""
        devices, containers = self._snapshot()
        per_container = _per_container(containers)
        del containers
        for key in _FAMILIES:
            yield key, _family(key, devices, per_container)

    def _series(self) -> Iterator[tuple[str, Sequence[str], float]]:
        """Every series of the families: (family key, label values in the family's label order, value)."""
        for key, series in self._by_family():
            for values, value in series:
                yield key, values, value

    def collect(self) -> Iterable[Metric]:
        f = self._families()
        for key, labels, value in self._series():
            f[key].add_metric(labels, value)
        return list(f.values())

    def exposition(self, out: bytearray) -> None:
        """`collect()` in the Prometheus text format, exactly as `generate_latest` writes it, appended to `out`,
        without building a sample object per series or the whole text as one string: at 1,000 nodes and 8,000
        pods a scrape is 72,000 lines (11 MB), which through the client's objects took 1.9 s of CPU beside
        filters and 43 MB at its peak (benchmarks/scheduler_metrics.py)."""
        for key, series in self._by_family():
            name, documentation, labels = _FAMILIES[key]
            doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
            out += f"# HELP {name} {doc}\n# TYPE {name} gauge\n".encode()
            # generate_latest writes a series' labels sorted by name: the label positions in that order
            order = sorted(range(len(labels)), key=labels.__getitem__)
            lines: list[str] = []
            for values, value in series:
                text = ",".join(f'{labels[i]}="{_escape(values[i])}"' for i in order)
                lines.append(f"{name}{{{text}}} {floatToGoString(value)}\n")  # type: ignore[no-untyped-call]
                if len(lines) == _LINES_PER_CHUNK:
                    out += "".join(lines).encode()
                    lines.clear()
            out += "".join(lines).encode()


_LINES_PER_CHUNK = 4096
"""Lines of the exposition encoded at once (about 0.6 MB): the text's memory is its bytes, not its strings."""


def _per_container(containers: Iterable[_ContainerRow]) -> dict[tuple[str, ...], list[int]]:
    """(zone, namespace, node, pod, container index, uuid) → [MiB, cores]: one device twice in one container
    (never written, but decodable) adds up."""
    per_container: dict[tuple[str, ...], list[int]] = {}
    for c in containers:
        labels: tuple[str, ...] = (ZONE, c.namespace, c.node, c.pod, str(c.container_index), c.uuid)
        total = per_container.setdefault(labels, [0, 0])
        total[0] += c.usedmem
        total[1] += c.usedcores
    return per_container


def _family(
    key: str, devices: Sequence[_DeviceRow], per_container: Mapping[tuple[str, ...], Sequence[int]]
) -> Iterator[tuple[Sequence[str], float]]:
    """One family's series: (label values in the family's label order, value)."""
    if key in ("vgpu_memory", "vgpu_cores"):
        for labels, (memory, cores) in per_container.items():
            yield labels, (memory * MIB if key == "vgpu_memory" else cores)
        return
    for d in devices:
        device = (ZONE, d.node, d.uuid, str(d.index), d.type)
        if key == "memory_limit":
            yield device, d.devmem * MIB
        elif key == "core_limit":
            yield device, d.devcore
        elif key == "memory_allocated":
            yield (*device[:4], str(d.devcore), d.type), d.usedmem * MIB
        elif key == "core_allocated":
            yield device, d.usedcores
        elif key == "shared":
            yield device, d.used
        elif key == "overview":
            yield (*device[:4], str(d.devcore), str(d.devmem), d.type), d.usedmem * MIB
        elif key == "memory_ratio" and d.devmem > 0:
            yield device, d.usedmem / d.devmem


def _escape(value: str) -> str:
    """A label value as the text format writes it (backslash, newline and double quote escaped)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _QuotaCollector(Collector):
    """HAMi's quota families from a `QuotaLedger`, once one is attached (both families exist from the start)."""

    def __init__(self) -> None:
        self.ledger: QuotaLedger | None = None

    def collect(self) -> Iterable[Metric]:
        used = GaugeMetricFamily(
            "hami_resource_quota_used",
            "resourcequota usage for a certain device",
            labels=["namespace", "quota_name", "limit"],
        )
        limit = GaugeMetricFamily(
            "hami_resource_quota_limit", "resourcequota limit for a certain device", labels=["namespace", "quota_name"]
        )
        for namespace, resource, amount, cap in self.ledger.totals() if self.ledger is not None else ():
            used.add_metric([namespace, resource, str(cap)], amount)
            limit.add_metric([namespace, resource], cap)
        return [used, limit]


class SchedulerMetrics:
    """The scheduler's metrics in one registry (a private one unless `registry` is given)."""

    def __init__(self, state: ClusterState, plugins: VendorPlugins, registry: CollectorRegistry | None = None) -> None:
        self.state = state
        self.plugins = plugins
        self.registry = registry if registry is not None else CollectorRegistry()
        self._state_families = _StateCollector(state)
        self.registry.register(self._state_families)
        r = self.registry
        self.verb_seconds = {
            verb: Histogram(
                f"hami_scheduler_{verb}_seconds",
                f"Time the extender took to answer kube-scheduler's {verb} call",
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
            for verb in ("filter", "prioritize", "bind")
        }
        self.lock_wait_seconds = Histogram(
            "hami_scheduler_node_lock_wait_seconds",
            "Time bind waited for the node lock (hami.io/mutex.lock)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.filter_outcomes = Counter(
            "hami_scheduler_filter_outcomes",
            "Filter answers by result: placed, unschedulable, error, passthrough",
            ["result"],
            registry=r,
        )
        for outcome in FILTER_OUTCOMES:
            self.filter_outcomes.labels(result=outcome)
        self.leader = Gauge("hami_scheduler_leader", "1 while this scheduler replica is the leader", registry=r)
        self.placement_mismatches = Counter(
            "hami_scheduler_placement_mismatches",
            "Pod annotations that differ from the placement the scheduler signed (each change once)",
            registry=r,
        )
        self.preemptions = Counter(
            "hami_scheduler_preemptions",
            "Preemptions by outcome: evicted (room held for the preemptor), dry_run, refused (a budget refused an "
            "eviction), failed (the hold could not be written)",
            ["result"],
            registry=r,
        )
        for outcome in PREEMPTION_RESULTS:
            self.preemptions.labels(result=outcome)
        self.preemption_victims = Counter(
            "hami_scheduler_preemption_victims", "Pods evicted through the Eviction API to make room for a preemptor",
            registry=r,
        )  # fmt: skip
        self.requeues = Counter(
            "hami_scheduler_requeues",
            "Pods asked to retry: refused from a view that missed a capacity free kube-scheduler had seen",
            registry=r,
        )
        self._standard = CollectorRegistry(auto_describe=False)
        """The registry's collectors but the state's, in its order: `render` writes the state's families itself."""
        for metric in (*self.verb_seconds.values(), self.lock_wait_seconds, self.filter_outcomes):
            self._standard.register(metric)
        self._standard.register(self.leader)
        self._standard.register(self.placement_mismatches)
        self._standard.register(self.preemptions)
        self._standard.register(self.preemption_victims)
        self._standard.register(self.requeues)
        self._quotas = _QuotaCollector()
        self.registry.register(self._quotas)
        self._standard.register(self._quotas)

    def watch_quotas(self, ledger: QuotaLedger) -> None:
        """Export `ledger`'s namespace quotas (`hami_resource_quota_used`, `hami_resource_quota_limit`)."""
        self._quotas.ledger = ledger

    # ---------------------------------------------------------------------------------- recording

    def observe(self, verb: str, seconds: float) -> None:
        """The time one extender verb took; the signature of `ExtenderApp(observe=...)`. Unknown verbs are ignored."""
        histogram = self.verb_seconds.get(verb)
        if histogram is not None:
            histogram.observe(max(seconds, 0.0))

    def observe_lock_wait(self, seconds: float) -> None:
        """The time one bind waited for its node lock (whether it then got it or not)."""
        self.lock_wait_seconds.observe(max(seconds, 0.0))

    def count_filter(self, outcome: str) -> None:
        """Count one filter answer; `outcome` is one of `FILTER_OUTCOMES`."""
        if outcome not in FILTER_OUTCOMES:
            raise ValueError(f"filter outcome {outcome!r} is not one of {', '.join(FILTER_OUTCOMES)}")
        self.filter_outcomes.labels(result=outcome).inc()

    def record_preemption(self, result: str, victims: int) -> None:
        """Count one preemption's outcome (`PREEMPTION_RESULTS`) and the pods it evicted."""
        self.preemptions.labels(result=result).inc()
        if victims:
            self.preemption_victims.inc(victims)

    def record_filter(self, result: FilterResult) -> None:
        """Count one filter answer by what `Extender.filter` returned."""
        self.count_filter(filter_outcome(result))

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    # ---------------------------------------------------------------------------------- exposing

    def render(self) -> bytes:
        """Every metric in the Prometheus text format (version 0.0.4): what `generate_latest(registry)` gives,
        the state's families written directly (`_StateCollector.exposition`)."""
        out = bytearray()
        self._state_families.exposition(out)
        out += generate_latest(self._standard)
        return out  # type: ignore[return-value]  # a bytearray: sent as bytes are, without a copy of 11 MB

    def serve_metrics(self, address: tuple[str, int]) -> MetricsServer:
        """Serve `GET /metrics` on `address` (port 0 picks one) from a background thread; `stop()` it when done."""
        return MetricsServer(self.render, address, name="scheduler metrics").start()
