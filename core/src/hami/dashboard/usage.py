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

`UsageCollector` scrapes the nodes in rounds, every `interval` seconds (every `WARM_UP_SECONDS` while it warms up:
until a round finds no daemon failing, for at most `WARM_UP_ROUNDS` rounds). `ScrapeRounds` decides which nodes and
when: only a node with an annotation of a HAMi node daemon (a vendor's register or handshake annotation, the node
lock's Lease offer: `daemon_annotations`) and an address is fetched, the others are said once why not; a node whose
daemon did not answer waits 2 s, doubled with each failure in a row up to `BACK_OFF_CAP_SECONDS`, and is scraped
every round again from its first answer; a round's scrapes start at an even pace over the round (at most
`SCRAPES_PER_SECOND`, so a round of 5,000 nodes lasts at least 25 s), never in a burst, and what they find is
recorded in batches as it comes. The nodes are listed (for their addresses) at most every `nodes_seconds`, and kept
slim between lists. Hosted in `hami scheduler`, the listing, scraping and parsing run in a process of their own
(`start_in_child`, from when the scheduler is ready): the scheduler's process only records the batches it is sent,
so the extender's filters do not wait for the interpreter lock behind them (in the scheduler's process, a round
over 1,000 silent nodes on a pool of 16 threads every 2 s took the filter's p99 from 7 to 53 ms:
benchmarks/scheduler_api.py). The collector keeps the newest `NodeUsage` per node, a bounded trend per device
(`Trend`: float32 rings, NaN for unknown, 120 samples by default: an hour at 30 s), the cluster's totals over
time, and per container and device the peaks of its use in 5-minute buckets (`Peaks`, an hour by default) from
which idle grants are found. Memory stays bounded by the number of devices and containers, whatever the uptime.
It never writes to the cluster.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from hami.cluster.nodelease import LEASE_ANNOTATION
from hami.cluster.port import Cluster, KubeObject, meta

__all__ = [
    "ContainerUse",
    "DeviceUse",
    "IdleGrant",
    "NodeList",
    "NodeUsage",
    "Peaks",
    "ScrapeRounds",
    "Trend",
    "UsageCollector",
    "UsageTotals",
    "daemon_annotations",
    "device_usage",
    "metrics_url",
    "read_metrics",
    "scrape_node",
    "scrape_url",
]

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 1.5
MAX_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
NAN = float("nan")
WARM_UP_SECONDS = 2.0
WARM_UP_ROUNDS = 30
BACK_OFF_CAP_SECONDS = 300.0
"""The longest a node whose daemon did not answer waits for its next scrape."""
SCRAPES_PER_SECOND = 200.0
"""The most scrapes a round starts per second: a round of N nodes lasts at least N / this (25 s at 5,000)."""
BATCH = 64
"""Figures reported (sent, from the collector's process) in batches of about this many nodes."""
CHILD_NICENESS = 10
"""How much lower than the scheduler's the priority of the collector's process is (`os.nice`)."""
NO_ADDRESS = "the node publishes no InternalIP address to reach its metrics at"
NO_DAEMON = "not scraped: the node has no annotation of a HAMi node daemon (no register, handshake or lock Lease)"

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

    def packed(self) -> tuple[Any, ...]:
        """These figures as plain tuples, which unpickle without running Python (16 times faster than the
        dataclasses: what the collector's process sends)."""
        return (
            self.node, self.url, self.at, self.error,
            tuple((uuid, d.memory_used, d.utilization, d.power, d.temperature) for uuid, d in self.devices.items()),
            tuple(
                (c.namespace, c.pod, c.container, c.device, c.memory_used, c.utilization, c.memory_granted,
                 c.cores_granted)
                for c in self.containers
            ),
        )  # fmt: skip

    @classmethod
    def unpacked(cls, packed: tuple[Any, ...]) -> NodeUsage:
        """`packed()` read back."""
        node, url, at, error, devices, containers = packed
        usage = cls(str(node), str(url), float(at), str(error))
        usage.devices = {str(d[0]): DeviceUse(*d[1:]) for d in devices}
        usage.containers = [ContainerUse(*c) for c in containers]
        return usage

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


def _labels(line: str, brace: int, close: int) -> dict[str, str]:
    """The labels of a sample line between its braces. Without a backslash (Kubernetes names, UUIDs and device
    types never have one) no value can hold a quote, so each ends at the next one: with this and HAMi's
    families left unread beside this project's, `read_metrics` of a node of 8 GPUs and 8 pods went from 763 to
    461 us (best of 5 x 100)."""
    inner = line[brace + 1 : close]
    if "\\" in inner:
        return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(line, brace, close)}
    labels = {}
    at = 0
    while (equals := inner.find('="', at)) >= 0 and (end := inner.find('"', equals + 2)) >= 0:
        labels[inner[at:equals].strip(" ,")] = inner[equals + 2 : end]
        at = end + 1
    return labels


def read_metrics(node: str, url: str, text: str, at: float) -> NodeUsage:
    """The figures of `text` (a node daemon's /metrics) that the dashboard shows."""
    usage = NodeUsage(node, url, at)
    devices: dict[str, dict[str, float]] = {}
    tasks: dict[tuple[str, str, str, str], dict[str, float]] = {}
    deferred: list[tuple[str, str, int, int, float]] = []
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
        if name in _HAMI_TASK:  # read only if the daemon has none of this project's families (below)
            deferred.append((name, line, brace, close, value))
            continue
        labels = _labels(line, brace, close)
        uuid = labels.get("device_uuid", "")
        if name in _DEVICE:
            devices.setdefault(uuid, {})[_DEVICE[name]] = value
        else:
            key = (labels.get("namespace_name", ""), labels.get("pod_name", ""), labels.get("container_name", ""), uuid)
            tasks.setdefault(key, {})[_TASK[name]] = value
    if not tasks:  # a daemon with HAMi's families only (HAMi's monitor): read them
        for name, line, brace, close, value in deferred:
            labels = _labels(line, brace, close)
            uuid = labels.get("device_uuid", "")
            key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""), uuid)
            figure = _HAMI_TASK[name]
            tasks.setdefault(key, {})[figure] = value / MIB if figure == "memory_used" else value
    usage.devices = {uuid: DeviceUse(**figures) for uuid, figures in devices.items()}
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


def _reachable(url: str) -> bool:
    """Whether the URL names a host (a node without an InternalIP leaves `{address}` empty)."""
    return "://" in url and not url.split("://", 1)[1].startswith((":", "/"))


def scrape_url(
    name: str,
    url: str,
    *,
    fetch: Callable[[str, float], str] = _fetch,
    timeout: float = TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.time,
) -> NodeUsage:
    """Node `name`'s figures at `url` now, or why there are none."""
    if not _reachable(url):
        return NodeUsage(name, url, clock(), error=NO_ADDRESS)
    try:
        text = fetch(url, timeout)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        return NodeUsage(name, url, clock(), error=f"the node daemon's metrics did not answer: {reason}")
    return read_metrics(name, url, text, clock())


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
    return scrape_url(name, metrics_url(template, node), fetch=fetch, timeout=timeout, clock=clock)


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


def daemon_annotations(plugins: object) -> frozenset[str]:
    """The Node annotations a node daemon of this project or HAMi writes: each vendor kind's register and handshake
    annotations, and the offer of the node lock's Lease. Empty when no vendor is loaded (then every node is
    scraped)."""
    names: set[str] = set()
    for kind in getattr(plugins, "kinds", None) or ():
        annotations = getattr(kind, "annotations", None)
        for name in (getattr(annotations, "node_register", ""), getattr(annotations, "node_handshake", "")):
            if name:
                names.add(str(name))
    return frozenset(names | {LEASE_ANNOTATION}) if names else frozenset()


def _slim(node: KubeObject, annotations: frozenset[str]) -> KubeObject:
    """What the collector keeps of a Node between lists: its name, which daemon annotations it has (not their
    values: a register annotation of 8 devices is a kilobyte) and its addresses."""
    m = meta(node)
    found = m.get("annotations") or {}
    return {
        "metadata": {"name": m.get("name"), "annotations": {k: "" for k in annotations if k in found}},
        "status": {"addresses": (node.get("status") or {}).get("addresses") or []},
    }


class NodeList:
    """The cluster's nodes, listed at most every `seconds` (kept slim, `_slim`); the last list kept when the API
    server fails."""

    def __init__(self, cluster: Cluster, annotations: frozenset[str], seconds: float, clock: Callable[[], float]):
        self.cluster, self.annotations, self.seconds, self.clock = cluster, annotations, seconds, clock
        self._nodes: list[KubeObject] = []
        self._at = -math.inf

    def __call__(self) -> list[KubeObject]:
        now = self.clock()
        if now - self._at >= self.seconds:
            try:
                listed = self.cluster.list("nodes")[0]
            except Exception as exc:  # the API server: keep the nodes known, try again next round
                log.warning("dashboard: listing the nodes for their metrics failed: %s", exc)
            else:
                self._nodes = [_slim(n, self.annotations) for n in listed]
                self._at = now
        return self._nodes


@dataclass(slots=True)
class _Pace:
    """One node's place in the rounds: its URL, its failures in a row, when it is next due, and the reason it is
    not scraped at all that was reported last (reported once, not every round)."""

    url: str
    failures: int = 0
    due_at: float = 0.0
    told: str = ""


class ScrapeRounds:
    """Which nodes a round scrapes and when (see the module): a node without a daemon's annotation (when
    `annotations` is not empty) or without an address is reported once with the reason and never fetched; a node
    whose daemon did not answer waits `WARM_UP_SECONDS` doubled with each failure in a row (at most
    `back_off_cap`), and is due again at its first answer; a round's scrapes start at an even pace over the round
    (`pause`, but at least one scrape per 1/`scrapes_per_second` s), never in a burst."""

    def __init__(
        self,
        template: str,
        *,
        annotations: frozenset[str] = frozenset(),
        interval: float = 30.0,
        timeout: float = TIMEOUT_SECONDS,
        back_off_cap: float = BACK_OFF_CAP_SECONDS,
        scrapes_per_second: float = SCRAPES_PER_SECOND,
        fetch: Callable[[str, float], str] = _fetch,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.template = template
        self.annotations = annotations
        self.monotonic = monotonic
        self.interval = interval
        self.timeout = timeout
        self.back_off_cap = back_off_cap
        self.scrapes_per_second = scrapes_per_second
        self.fetch = fetch
        self.clock = clock
        self.warm = False
        """Whether the warm-up is over: a round found no daemon failing, or `WARM_UP_ROUNDS` rounds were run."""
        self.rounds = 0
        self._paces: dict[str, _Pace] = {}

    def plan(self, nodes: Iterable[KubeObject]) -> tuple[list[tuple[str, str]], list[NodeUsage], list[str]]:
        """(name, URL) of the nodes due now; what is said of the nodes never scraped, where it was not said yet;
        and the name of every node listed."""
        now = self.clock()
        due: list[tuple[str, str]] = []
        told: list[NodeUsage] = []
        listed: list[str] = []
        paces: dict[str, _Pace] = {}
        for node in nodes:
            m = meta(node)
            name = str(m.get("name") or "")
            url = metrics_url(self.template, node)
            listed.append(name)
            pace = self._paces.get(name)
            if pace is None or pace.url != url:  # new, or moved: due now
                pace = _Pace(url)
            paces[name] = pace
            reason = ""
            if self.annotations and self.annotations.isdisjoint(m.get("annotations") or ()):
                reason = NO_DAEMON
            elif not _reachable(url):
                reason = NO_ADDRESS
            if reason:
                if pace.told != reason:
                    told.append(NodeUsage(name, url, now, error=reason))
                pace.told = reason
            else:
                pace.told = ""
                if pace.due_at <= now:
                    due.append((name, url))
        self._paces = paces
        return due, told, listed

    def scrape(self, name: str, url: str) -> NodeUsage:
        """Scrape one node now; its answer, or its silence, sets when it is due next."""
        usage = scrape_url(name, url, fetch=self.fetch, timeout=self.timeout, clock=self.clock)
        pace = self._paces.get(name)
        if pace is not None:
            if usage.error:
                pace.failures += 1
                pace.due_at = self.clock() + min(self.back_off_cap, WARM_UP_SECONDS * 2.0 ** min(pace.failures - 1, 32))
            else:
                pace.failures, pace.due_at = 0, 0.0
        return usage

    def failing(self) -> int:
        """Nodes whose daemon did not answer its last scrape."""
        return sum(1 for p in self._paces.values() if p.failures)

    def end_round(self) -> None:
        self.rounds += 1
        if self.failing() == 0 or self.rounds >= WARM_UP_ROUNDS:
            self.warm = True

    def pause(self) -> float:
        """The time from one round's start to the next's: `interval`, but `WARM_UP_SECONDS` while warming up, so
        daemons that come up after the dashboard are seen in seconds rather than after a whole interval."""
        return self.interval if self.warm else min(self.interval, WARM_UP_SECONDS)

    def length(self, due: int) -> float:
        """How long a round of `due` scrapes lasts: its pause, longer when the scrapes would come faster than
        `scrapes_per_second`."""
        return max(self.pause(), due / self.scrapes_per_second)

    def run(
        self,
        nodes: Callable[[], Iterable[KubeObject]],
        report: Callable[[list[NodeUsage]], None],
        end: Callable[[list[str]], None],
        stop: threading.Event,
        pool: ThreadPoolExecutor,
    ) -> None:
        """Rounds until `stop`: each round's scrapes started on `pool` at an even pace over `length`, what they
        found reported in batches as it comes (`report`), then the round ended with every node listed (`end`)."""
        done: queue.SimpleQueue[NodeUsage] = queue.SimpleQueue()

        def flush() -> None:
            batch = []
            while True:
                try:
                    batch.append(done.get_nowait())
                except queue.Empty:
                    break
            if batch:
                report(batch)

        def scrape(name: str, url: str) -> None:
            done.put(self.scrape(name, url))

        while not stop.is_set():
            started = self.monotonic()
            try:
                due, told, listed = self.plan(nodes())
            except Exception:  # a round that fails is skipped; the dashboard goes on
                log.exception("dashboard: planning the nodes' scrapes failed")
                stop.wait(self.pause())
                continue
            if told:
                report(told)
            length = self.length(len(due))
            futures: list[Future[None]] = []
            flushed = self.monotonic()
            for n, (name, url) in enumerate(due):
                wait = started + n * length / len(due) - self.monotonic()
                if wait > 0 and stop.wait(wait):
                    break
                futures.append(pool.submit(scrape, name, url))
                if done.qsize() >= BATCH or self.monotonic() - flushed >= 1.0:
                    flush()
                    flushed = self.monotonic()
            wait_for(futures)
            flush()
            if stop.is_set():
                break
            self.end_round()
            end(listed)
            stop.wait(max(0.0, started + length - self.monotonic()))


class UsageCollector:
    """Every node daemon's figures, scraped in paced rounds, with bounded history (see the module)."""

    def __init__(
        self,
        template: str,
        cluster: Cluster | None = None,
        *,
        nodes: Callable[[], Iterable[KubeObject]] | None = None,
        annotations: frozenset[str] = frozenset(),
        interval: float = 30.0,
        history: int = 120,
        bucket_seconds: float = 300.0,
        buckets: int = 12,
        workers: int = 16,
        timeout: float = TIMEOUT_SECONDS,
        nodes_seconds: float = 300.0,
        back_off_cap: float = BACK_OFF_CAP_SECONDS,
        scrapes_per_second: float = SCRAPES_PER_SECOND,
        fetch: Callable[[str, float], str] = _fetch,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if nodes is None and cluster is None:
            raise ValueError("a UsageCollector needs the cluster or a source of nodes")
        self.template = template
        self.cluster = cluster
        self.annotations = annotations
        self.interval = interval
        self.history = history
        self.bucket_seconds = bucket_seconds
        self.buckets = buckets
        self.workers = workers
        self.timeout = timeout
        self.nodes_seconds = nodes_seconds
        self.fetch = fetch
        self.clock = clock
        self.scrapes = ScrapeRounds(
            template, annotations=annotations, interval=interval, timeout=timeout, back_off_cap=back_off_cap,
            scrapes_per_second=scrapes_per_second, fetch=fetch, clock=clock,
        )  # fmt: skip
        if nodes is None:
            assert cluster is not None
            nodes = NodeList(cluster, annotations, nodes_seconds, clock)
        self._nodes = nodes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dashboard-usage")
        self._lock = threading.Lock()
        self._latest: dict[str, NodeUsage] = {}
        self._trends: dict[str, Trend] = {}
        self._peaks: dict[tuple[str, str, str, str], Peaks] = {}
        self._where: dict[tuple[str, str, str, str], str] = {}
        self._device_node: dict[str, str] = {}
        self._seen_devices: set[str] = set()
        self._seen_containers: set[tuple[str, str, str, str]] = set()
        self._totals: deque[UsageTotals] = deque(maxlen=max(history * 6, 720))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: multiprocessing.process.BaseProcess | None = None
        self.rounds = 0

    # ---------------------------------------------------------------------------------- collecting

    def collect(self) -> None:
        """One round now, every due node scraped at once (on the pool), then recorded: for a page when no
        collector runs in the background, and for tests."""
        due, told, listed = self.scrapes.plan(self._nodes())
        found = list(self._pool.map(lambda target: self.scrapes.scrape(*target), due))
        self.scrapes.end_round()
        self.add(told + found)
        self.end_round(listed)

    def record(self, found: Iterable[NodeUsage]) -> None:
        """These figures as one whole round of the nodes they are of."""
        found = list(found)
        self.add(found)
        self.end_round([u.node for u in found])

    def add(self, found: Iterable[NodeUsage]) -> None:
        """Keep these figures as their nodes' newest and add them to the history."""
        with self._lock:
            for usage in found:
                self._latest[usage.node] = usage
                if usage.error:
                    continue
                bucket = int(usage.at // self.bucket_seconds)
                for uuid, d in usage.devices.items():
                    self._seen_devices.add(uuid)
                    self._device_node[uuid] = usage.node
                    trend = self._trends.get(uuid)
                    if trend is None:
                        trend = self._trends[uuid] = Trend(self.history, 4)
                    trend.add(usage.at, (d.utilization, d.memory_used, d.power, d.temperature))
                for c in usage.containers:
                    key = (c.namespace, c.pod, c.container, c.device)
                    self._seen_containers.add(key)
                    self._where[key] = usage.node
                    peaks = self._peaks.get(key)
                    if peaks is None:
                        peaks = self._peaks[key] = Peaks(self.buckets, usage.at)
                    peaks.add(bucket, c.memory_used, c.utilization)

    def end_round(self, listed: Iterable[str]) -> None:
        """A round is over: the nodes no longer `listed` are forgotten, and so is a device or container that its
        node, answering, no longer reported in the round (a node that did not answer, or was not due, keeps its
        history: it may answer later); the cluster's totals over the nodes' newest figures join the history."""
        now = self.clock()
        names = set(listed)
        memory, memory_n, busy, busy_n = 0.0, 0, 0.0, 0
        with self._lock:
            for name in [n for n in self._latest if n not in names]:
                del self._latest[name]
            silent = {n for n, u in self._latest.items() if u.error}
            for uuid in list(self._trends):
                if uuid not in self._seen_devices and self._device_node.get(uuid, "") not in silent:
                    del self._trends[uuid]
                    self._device_node.pop(uuid, None)
            for key in list(self._peaks):
                if key not in self._seen_containers and self._where.get(key, "") not in silent:
                    del self._peaks[key]
                    self._where.pop(key, None)
            self._seen_devices, self._seen_containers = set(), set()
            for usage in self._latest.values():
                if usage.error:
                    continue
                for d in usage.devices.values():
                    if d.memory_used is not None:
                        memory, memory_n = memory + d.memory_used, memory_n + 1
                    if d.utilization is not None:
                        busy, busy_n = busy + d.utilization, busy_n + 1
            self._totals.append(
                UsageTotals(
                    at=now,
                    memory_used=memory,
                    memory_reported=memory_n,
                    utilization=busy / busy_n if busy_n else None,
                    devices_reported=busy_n,
                    nodes=len(names),
                    nodes_answering=sum(1 for n in names if n in self._latest and not self._latest[n].error),
                )
            )
            self.rounds += 1

    def start(self, *, after: Callable[[], bool] | None = None) -> UsageCollector:
        """Collect in paced rounds on a thread of its own until `stop()`, from when `after()` is true (polled)."""

        def loop() -> None:
            if self._waited(after):
                self.scrapes.run(self._nodes, self.add, self.end_round, self._stop, self._pool)

        self._thread = threading.Thread(target=loop, name="dashboard-usage", daemon=True)
        self._thread.start()
        return self

    def start_in_child(self, kubeconfig: str | None, *, after: Callable[[], bool] | None = None) -> UsageCollector:
        """Collect as `start` does, but list, scrape and parse in a process of its own (connected with `kubeconfig`,
        or the pod's service account): this process only records what it sends, in batches, on a thread that
        waits for them. A process that exits is started again after `interval`."""
        context = multiprocessing.get_context("spawn")
        settings = {
            "template": self.template, "annotations": self.annotations, "interval": self.interval,
            "timeout": self.timeout, "back_off_cap": self.scrapes.back_off_cap,
            "scrapes_per_second": self.scrapes.scrapes_per_second, "nodes_seconds": self.nodes_seconds,
            "workers": self.workers,
        }  # fmt: skip

        def loop() -> None:
            while self._waited(after) and not self._stop.is_set():
                receiving, sending = context.Pipe(duplex=False)
                child = context.Process(
                    target=_scrape_in_child, args=(sending, kubeconfig, settings), name="hami-dashboard-usage"
                )
                child.daemon = True
                child.start()
                sending.close()
                self._child = child
                try:
                    while True:
                        what, payload = receiving.recv()
                        if what == "usage":
                            self.add([NodeUsage.unpacked(p) for p in payload])
                        else:
                            self.end_round(payload)
                except (EOFError, OSError):
                    pass
                finally:
                    receiving.close()
                child.join(5)
                if not self._stop.is_set():
                    log.warning(
                        "dashboard: the usage collector's process exited (%s): starting it again", child.exitcode
                    )
                    self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="dashboard-usage", daemon=True)
        self._thread.start()
        return self

    def _waited(self, after: Callable[[], bool] | None) -> bool:
        """Wait until `after()` is true (polled); False when stopped first."""
        while after is not None and not after():
            if self._stop.wait(0.5):
                return False
        return not self._stop.is_set()

    @property
    def running(self) -> bool:
        """Whether a background thread collects (else pages collect when they ask)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.is_alive():
            child.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if child is not None:
            child.join(5)
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


def _scrape_in_child(sending: Connection, kubeconfig: str | None, settings: dict[str, Any]) -> None:
    """The collector's process (`UsageCollector.start_in_child`): its own connection to the API server, the rounds,
    and what they find sent to the parent; it ends when the parent stops reading or goes away."""
    from hami.cluster.kube import connect

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # background work: the scheduler's threads and the API server have the CPU first when both want it
        os.nice(CHILD_NICENESS)
    except OSError as exc:
        log.warning("dashboard: the usage collector's process runs at the scheduler's priority: %s", exc)
    parent = os.getppid()
    stop = threading.Event()
    nodes_seconds = float(settings.pop("nodes_seconds"))
    workers = int(settings.pop("workers"))
    rounds = ScrapeRounds(**settings)
    listing = NodeList(connect(kubeconfig), rounds.annotations, nodes_seconds, time.time)

    def nodes() -> list[KubeObject]:
        if os.getppid() != parent:
            stop.set()
        return listing()

    def send(message: tuple[str, object]) -> None:
        try:
            sending.send(message)
        except OSError:  # the parent is gone or stopped reading
            stop.set()

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dashboard-usage")
    rounds.run(
        nodes,
        lambda batch: send(("usage", [u.packed() for u in batch])),
        lambda listed: send(("round", listed)),
        stop,
        pool,
    )
    pool.shutdown(wait=False, cancel_futures=True)
