"""What devices and containers really use, for the dashboard, from the node daemons' metrics: no Prometheus needed.

Owns turning a metrics URL template into a node's URL (`{node}` the Node's name, `{address}` its InternalIP,
e.g. `http://{address}:9394/metrics`), fetching it with a short timeout, and reading the families of
`hami.node.monitor` it needs: per device the memory in use, the busy share, power and temperature
(`hami_memory_used`, `hami_core_util`, `hami_device_power`, `hami_device_temperature`), per container and device
what was granted and what is used (`hami_container_vmemory_allocated`, `hami_container_vcore_allocated`,
`hami_container_memory_used`, `hami_container_core_used`; a daemon without these, such as HAMi's own monitor, is
read through HAMi's `hami_vgpu_memory_used_bytes` and `hami_container_device_utilization_ratio`). Only those
lines are parsed (a node's scrape is a few hundred lines; reading them through the client's parser cost 10 times
more at 1,000 nodes: benchmarks/dashboard.py).

A figure the node does not report is unknown (None), never zero: the monitor leaves out what its vendor cannot
read or reads as nonsense, and the pages show "unknown". A node that does not answer, or answers something else,
gives a `NodeUsage` with the reason instead of figures.

`UsageCollector` scrapes every node on a bounded pool of threads every `interval` seconds (it lists the nodes, for
their addresses, at most every `nodes_seconds`), keeps the newest `NodeUsage` per node, a bounded trend per device
(`Trend`: float32 rings, NaN for unknown, 120 samples by default: an hour at 30 s), the cluster's totals over
time, and per container and device the peaks of its use in 5-minute buckets (`Peaks`, an hour by default) from
which idle grants are found. Memory stays bounded by the number of devices and containers, whatever the uptime.
It never writes to the cluster.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hami.cluster.port import Cluster, KubeObject, meta

__all__ = [
    "ContainerUse",
    "DeviceUse",
    "IdleGrant",
    "NodeUsage",
    "Peaks",
    "Trend",
    "UsageCollector",
    "UsageTotals",
    "device_usage",
    "metrics_url",
    "read_metrics",
]

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 1.5
MAX_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
NAN = float("nan")
WARM_UP_SECONDS = 2.0
WARM_UP_ROUNDS = 30

_DEVICE = {
    "hami_memory_used": "memory_used",
    "hami_core_util": "utilization",
    "hami_device_power": "power",
    "hami_device_temperature": "temperature",
}
_TASK = {
    "hami_container_memory_used": "memory_used",
    "hami_container_core_used": "utilization",
    "hami_container_vmemory_allocated": "memory_granted",
    "hami_container_vcore_allocated": "cores_granted",
}
_HAMI_TASK = {"hami_vgpu_memory_used_bytes": "memory_used", "hami_container_device_utilization_ratio": "utilization"}
_WANTED = frozenset(_DEVICE) | frozenset(_TASK) | frozenset(_HAMI_TASK)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One device's own figures; None where the node does not report them."""

    memory_used: float | None = None
    """MiB."""
    utilization: float | None = None
    """Percent of the time busy."""
    power: float | None = None
    """Watts."""
    temperature: float | None = None
    """Degrees Celsius."""


@dataclass(frozen=True, slots=True)
class ContainerUse:
    """One container's grant on one device and what it uses of it (None: not accounted yet)."""

    namespace: str
    pod: str
    container: str
    device: str
    memory_used: float | None = None
    """MiB."""
    utilization: float | None = None
    """Percent of the device."""
    memory_granted: int | None = None
    """MiB."""
    cores_granted: int | None = None
    """Percent of the device; 0: no core limit."""


@dataclass
class NodeUsage:
    """What one node daemon reported at `at` (seconds since the epoch), or why it reported nothing."""

    node: str
    url: str
    at: float = 0.0
    error: str = ""
    devices: dict[str, DeviceUse] = field(default_factory=dict)
    containers: list[ContainerUse] = field(default_factory=list)

    def of_pod(self, namespace: str, pod: str, device: str | None = None) -> tuple[float | None, float | None] | None:
        """Memory (MiB) and device share (percent) the pod's containers use (on `device`, or on all), summed; None
        when the node names none of its containers, a figure None when no container of it reports that figure."""
        mine = [
            c
            for c in self.containers
            if (c.namespace, c.pod) == (namespace, pod) and (device is None or c.device == device)
        ]
        if not mine:
            return None
        memory = [c.memory_used for c in mine if c.memory_used is not None]
        share = [c.utilization for c in mine if c.utilization is not None]
        return (sum(memory) if memory else None, sum(share) if share else None)


def metrics_url(template: str, node: KubeObject) -> str:
    addresses = (node.get("status") or {}).get("addresses") or ()
    address = next((str(a.get("address")) for a in addresses if a.get("type") == "InternalIP"), "")
    return template.replace("{node}", str(meta(node).get("name") or "")).replace("{address}", address)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_metrics(node: str, url: str, text: str, at: float) -> NodeUsage:
    """The figures of `text` (a node daemon's /metrics) that the dashboard shows."""
    usage = NodeUsage(node, url, at)
    devices: dict[str, dict[str, float]] = {}
    tasks: dict[tuple[str, str, str, str], dict[str, float]] = {}
    hami: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("hami_"):
            continue
        brace = line.find("{")
        if brace < 0 or line[:brace] not in _WANTED:
            continue
        name = line[:brace]
        close = line.rfind("}")
        value = _number(line[close + 1 :].split()[0]) if close > brace and line[close + 1 :].split() else None
        if value is None:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(line, brace, close)}
        uuid = labels.get("device_uuid", "")
        if name in _DEVICE:
            devices.setdefault(uuid, {})[_DEVICE[name]] = value
        elif name in _TASK:
            key = (labels.get("namespace_name", ""), labels.get("pod_name", ""), labels.get("container_name", ""), uuid)
            tasks.setdefault(key, {})[_TASK[name]] = value
        else:
            key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""), uuid)
            figure = _HAMI_TASK[name]
            hami.setdefault(key, {})[figure] = value / MIB if figure == "memory_used" else value
    usage.devices = {uuid: DeviceUse(**figures) for uuid, figures in devices.items()}
    if not tasks:  # a daemon with HAMi's families only (HAMi's monitor): read them
        tasks = hami
    usage.containers = [
        ContainerUse(
            ns, pod, container, uuid,
            memory_used=f.get("memory_used"), utilization=f.get("utilization"),
            memory_granted=int(f["memory_granted"]) if "memory_granted" in f else None,
            cores_granted=int(f["cores_granted"]) if "cores_granted" in f else None,
        )
        for (ns, pod, container, uuid), f in sorted(tasks.items())
    ]  # fmt: skip
    return usage


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return str(answer.read(MAX_BYTES).decode("utf-8", "replace"))


def scrape_node(
    template: str,
    node: KubeObject,
    *,
    fetch: Callable[[str, float], str] = _fetch,
    timeout: float = TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.time,
) -> NodeUsage:
    """One node's figures now, or why there are none."""
    name = str(meta(node).get("name") or "")
    url = metrics_url(template, node)
    if "://" not in url or url.split("://", 1)[1].startswith((":", "/")):
        return NodeUsage(name, url, clock(), error="the node publishes no InternalIP address to reach its metrics at")
    try:
        text = fetch(url, timeout)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        return NodeUsage(name, url, clock(), error=f"the node daemon's metrics did not answer: {reason}")
    return read_metrics(name, url, text, clock())


def device_usage(template: str, node: KubeObject, uuid: str) -> NodeUsage:
    """The node's figures now (the device page without a collector)."""
    return scrape_node(template, node)


# --------------------------------------------------------------------------------------------------------
# History
# --------------------------------------------------------------------------------------------------------


class Trend:
    """The last `capacity` samples of a few figures (float32, NaN for unknown), oldest first."""

    __slots__ = ("_at", "_next", "_size", "_values", "capacity", "series")

    def __init__(self, capacity: int, series: int) -> None:
        self.capacity, self.series = capacity, series
        self._at = array("d", bytes(8 * capacity))
        self._values = array("f", [NAN]) * (capacity * series)
        self._next = self._size = 0

    def add(self, at: float, figures: Sequence[float | None]) -> None:
        slot = self._next
        self._at[slot] = at
        for n in range(self.series):
            value = figures[n]
            self._values[slot * self.series + n] = NAN if value is None else value
        self._next = (slot + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def samples(self, since: float = 0.0) -> list[tuple[float, tuple[float | None, ...]]]:
        """(time, figures) from `since` on, oldest first, None for unknown."""
        out = []
        first = (self._next - self._size) % self.capacity
        for k in range(self._size):
            slot = (first + k) % self.capacity
            if self._at[slot] < since:
                continue
            row = self._values[slot * self.series : (slot + 1) * self.series]
            out.append((self._at[slot], tuple(None if math.isnan(v) else v for v in row)))
        return out


class Peaks:
    """The highest memory (MiB) and device share (percent) one container used on one device, per bucket of
    `bucket_seconds` (aligned to the clock), for the last `buckets` buckets, and when it was first seen."""

    __slots__ = ("_bucket", "_values", "buckets", "first_seen")

    def __init__(self, buckets: int, at: float) -> None:
        self.buckets = buckets
        self.first_seen = at
        self._values = array("f", [NAN]) * (2 * buckets)
        self._bucket = -1

    def add(self, bucket: int, memory: float | None, share: float | None) -> None:
        if bucket != self._bucket:
            for b in range(max(self._bucket + 1, bucket - self.buckets + 1), bucket + 1):
                slot = b % self.buckets
                self._values[2 * slot] = self._values[2 * slot + 1] = NAN
            self._bucket = max(bucket, self._bucket)
        slot = bucket % self.buckets
        for n, value in enumerate((memory, share)):
            if value is not None:
                old = self._values[2 * slot + n]
                self._values[2 * slot + n] = value if math.isnan(old) else max(old, value)

    def peak(self, since_bucket: int) -> tuple[float | None, float | None]:
        """The highest memory and share from bucket `since_bucket` on (None: never reported there)."""
        best: list[float | None] = [None, None]
        for b in range(max(since_bucket, self._bucket - self.buckets + 1), self._bucket + 1):
            slot = b % self.buckets
            for n in range(2):
                v = self._values[2 * slot + n]
                if not math.isnan(v):
                    best[n] = v if best[n] is None else max(best[n] or 0.0, v)
        return best[0], best[1]

    def series(self, bucket_seconds: float) -> list[tuple[float, float | None, float | None]]:
        """(bucket start, memory peak, share peak), oldest first."""
        out = []
        for b in range(self._bucket - self.buckets + 1, self._bucket + 1):
            if b < 0 or (b + 1) * bucket_seconds < self.first_seen:
                continue
            slot = b % self.buckets
            memory, share = self._values[2 * slot], self._values[2 * slot + 1]
            out.append(
                (b * bucket_seconds, None if math.isnan(memory) else memory, None if math.isnan(share) else share)
            )
        return out


@dataclass(frozen=True)
class UsageTotals:
    """The cluster's usage at one moment, over the devices that report it."""

    at: float
    memory_used: float
    """MiB in use on the devices that report memory."""
    memory_reported: int
    """Devices reporting memory."""
    utilization: float | None
    """Mean busy percent over the devices that report it."""
    devices_reported: int
    nodes: int
    nodes_answering: int


@dataclass(frozen=True)
class IdleGrant:
    """A container whose use stayed far below its grant for the whole window."""

    namespace: str
    pod: str
    container: str
    device: str
    node: str
    memory_granted: int
    memory_peak: float | None
    cores_granted: int
    share_peak: float | None
    seconds: float
    """How long it has been watched (at least the window)."""

    @property
    def memory_back(self) -> int:
        """MiB it could give back: its grant less its peak."""
        return max(0, self.memory_granted - math.ceil(self.memory_peak or 0))

    @property
    def cores_back(self) -> int:
        """Percent of the device it could give back (0 when the grant sets no core limit)."""
        return max(0, self.cores_granted - math.ceil(self.share_peak or 0)) if self.cores_granted else 0


class UsageCollector:
    """Every node daemon's figures, scraped every `interval` seconds, with bounded history (see the module)."""

    def __init__(
        self,
        template: str,
        cluster: Cluster | None = None,
        *,
        nodes: Callable[[], Iterable[KubeObject]] | None = None,
        interval: float = 30.0,
        history: int = 120,
        bucket_seconds: float = 300.0,
        buckets: int = 12,
        workers: int = 16,
        timeout: float = TIMEOUT_SECONDS,
        nodes_seconds: float = 300.0,
        fetch: Callable[[str, float], str] = _fetch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if nodes is None and cluster is None:
            raise ValueError("a UsageCollector needs the cluster or a source of nodes")
        self.template = template
        self.cluster = cluster
        self._nodes_source = nodes
        self.interval = interval
        self.history = history
        self.bucket_seconds = bucket_seconds
        self.buckets = buckets
        self.timeout = timeout
        self.nodes_seconds = nodes_seconds
        self.fetch = fetch
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dashboard-usage")
        self._lock = threading.Lock()
        self._latest: dict[str, NodeUsage] = {}
        self._trends: dict[str, Trend] = {}
        self._peaks: dict[tuple[str, str, str, str], Peaks] = {}
        self._where: dict[tuple[str, str, str, str], str] = {}
        self._device_node: dict[str, str] = {}
        self._totals: deque[UsageTotals] = deque(maxlen=max(history * 6, 720))
        self._nodes: list[KubeObject] = []
        self._nodes_at = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warm = False
        self.rounds = 0

    # ---------------------------------------------------------------------------------- collecting

    def _node_objects(self) -> list[KubeObject]:
        if self._nodes_source is not None:
            return list(self._nodes_source())
        now = self.clock()
        if now - self._nodes_at >= self.nodes_seconds:
            assert self.cluster is not None
            try:
                self._nodes = list(self.cluster.list("nodes")[0])
                self._nodes_at = now
            except Exception as exc:  # the API server: keep the nodes known, try again next round
                log.warning("dashboard: listing the nodes for their metrics failed: %s", exc)
        return self._nodes

    def collect(self) -> None:
        """One round: every node scraped (on the pool), then recorded."""
        nodes = self._node_objects()
        found = list(
            self._pool.map(
                lambda n: scrape_node(self.template, n, fetch=self.fetch, timeout=self.timeout, clock=self.clock),
                nodes,
            )
        )
        self.record(found)

    def record(self, found: Iterable[NodeUsage]) -> None:
        """Keep these figures as the newest, and add them to the history. A node that did not answer keeps its
        history (it may answer next round); a device or container its node no longer reports, or of a node no
        longer listed, is forgotten."""
        now = self.clock()
        bucket = int(now // self.bucket_seconds)
        found = list(found)
        listed = {u.node for u in found}
        silent = {u.node for u in found if u.error}
        memory, memory_n, busy, busy_n = 0.0, 0, 0.0, 0
        with self._lock:
            self._latest = {u.node: u for u in found}
            seen_devices: set[str] = set()
            seen_containers: set[tuple[str, str, str, str]] = set()
            for usage in found:
                if usage.error:
                    continue
                for uuid, d in usage.devices.items():
                    seen_devices.add(uuid)
                    self._device_node[uuid] = usage.node
                    trend = self._trends.get(uuid)
                    if trend is None:
                        trend = self._trends[uuid] = Trend(self.history, 4)
                    trend.add(usage.at, (d.utilization, d.memory_used, d.power, d.temperature))
                    if d.memory_used is not None:
                        memory, memory_n = memory + d.memory_used, memory_n + 1
                    if d.utilization is not None:
                        busy, busy_n = busy + d.utilization, busy_n + 1
                for c in usage.containers:
                    key = (c.namespace, c.pod, c.container, c.device)
                    seen_containers.add(key)
                    self._where[key] = usage.node
                    peaks = self._peaks.get(key)
                    if peaks is None:
                        peaks = self._peaks[key] = Peaks(self.buckets, usage.at)
                    peaks.add(bucket, c.memory_used, c.utilization)
            for uuid in list(self._trends):
                node = self._device_node.get(uuid, "")
                if uuid not in seen_devices and (node not in silent or node not in listed):
                    del self._trends[uuid]
                    self._device_node.pop(uuid, None)
            for key in list(self._peaks):
                node = self._where.get(key, "")
                if key not in seen_containers and (node not in silent or node not in listed):
                    del self._peaks[key]
                    self._where.pop(key, None)
            self._totals.append(
                UsageTotals(
                    at=now,
                    memory_used=memory,
                    memory_reported=memory_n,
                    utilization=busy / busy_n if busy_n else None,
                    devices_reported=busy_n,
                    nodes=len(found),
                    nodes_answering=len(found) - len(silent),
                )
            )
            self.rounds += 1

    def start(self) -> UsageCollector:
        """Collect every `interval` seconds on a thread of its own until `stop()`."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.collect()
                except Exception:  # a round that fails is skipped; the dashboard goes on
                    log.exception("dashboard: collecting the nodes' usage failed")
                self._stop.wait(self._pause())

        self._thread = threading.Thread(target=loop, name="dashboard-usage", daemon=True)
        self._thread.start()
        return self

    def _pause(self) -> float:
        """The wait before the next round: `interval`, but `WARM_UP_SECONDS` while starting up (until one round
        found every node answering, for at most `WARM_UP_ROUNDS` rounds), so daemons that come up after the
        dashboard are seen in seconds rather than after a whole interval."""
        with self._lock:
            totals = self._totals[-1] if self._totals else None
        if totals is not None and totals.nodes_answering == totals.nodes:
            self._warm = True
        if self._warm or self.rounds >= WARM_UP_ROUNDS:
            return self.interval
        return min(self.interval, WARM_UP_SECONDS)

    @property
    def running(self) -> bool:
        """Whether a background thread collects (else pages collect when they ask)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------- reading

    def node(self, name: str) -> NodeUsage | None:
        with self._lock:
            return self._latest.get(name)

    def nodes(self) -> dict[str, NodeUsage]:
        with self._lock:
            return dict(self._latest)

    def device(self, uuid: str) -> DeviceUse | None:
        with self._lock:
            for usage in self._latest.values():
                if uuid in usage.devices:
                    return usage.devices[uuid]
        return None

    def device_trend(self, uuid: str, since: float = 0.0) -> list[tuple[float, tuple[float | None, ...]]]:
        """(time, (busy %, memory MiB, watts, °C)) of the device, oldest first."""
        with self._lock:
            trend = self._trends.get(uuid)
            return trend.samples(since) if trend is not None else []

    def container_peaks(
        self, namespace: str, pod: str
    ) -> dict[tuple[str, str], list[tuple[float, float | None, float | None]]]:
        """(container, device) → its 5-minute peaks (bucket start, MiB, share %), for the pod's page."""
        with self._lock:
            return {
                (c, d): peaks.series(self.bucket_seconds)
                for (ns, p, c, d), peaks in self._peaks.items()
                if (ns, p) == (namespace, pod)
            }

    def totals(self, since: float = 0.0) -> list[UsageTotals]:
        with self._lock:
            return [t for t in self._totals if t.at >= since]

    def idle_grants(
        self, window_seconds: float, *, memory_share: float = 0.1, core_share: float = 0.1
    ) -> list[IdleGrant]:
        """Containers watched for at least `window_seconds` whose peak memory stayed under `memory_share` of their
        memory grant and whose peak device share stayed under `core_share` of their core grant (of the whole
        device when the grant sets no core limit), the largest memory to give back first."""
        now = self.clock()
        since = int((now - window_seconds) // self.bucket_seconds) + 1
        out = []
        with self._lock:
            grants = {
                (c.namespace, c.pod, c.container, c.device): (u.node, c)
                for u in self._latest.values()
                for c in u.containers
            }
            for key, (node, c) in grants.items():
                peaks = self._peaks.get(key)
                if peaks is None or now - peaks.first_seen < window_seconds or not c.memory_granted:
                    continue
                memory, share = peaks.peak(since)
                if memory is None and share is None:
                    continue
                cores = c.cores_granted or 0
                if (memory or 0) >= memory_share * c.memory_granted or (share or 0) >= core_share * (cores or 100):
                    continue
                out.append(IdleGrant(*key, node, c.memory_granted, memory, cores, share, now - peaks.first_seen))
        return sorted(out, key=lambda g: (-g.memory_back, g.namespace, g.pod, g.container))


def merge_pod_use(usage: Mapping[str, NodeUsage], namespace: str, pod: str) -> list[ContainerUse]:
    """The containers of one pod as the nodes report them."""
    return [c for u in usage.values() for c in u.containers if (c.namespace, c.pod) == (namespace, pod)]
