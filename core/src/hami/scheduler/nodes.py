"""Node reading: what the scheduler makes of a Node object (its devices per kind, what it offers to pods, and
whether HAMi's handshake rule drops its devices), and the record it keeps of each node (`NodeRecord`).

A node's devices come from its vendors' register annotations, or from the vendor's own node annotation through
`hami_node_devices`, or from its capacity for kinds that publish none (protocol.md section 3). Malformed ones
count as none, logged. What a record was read from is kept (`NodeRecord.inputs`, every annotation but the lock
and the handshake), so that a node event changing nothing else keeps the record and its memoised evaluations.

A node's devices of a kind are not counted while HAMi's handshake rule drops them (`handshake_verdict`): the
question `Requesting_<time>` is older than the timeout while the node's allocatable for the kind's count
resource is 0 (so a scheduler that starts long after a node's daemon went away does not place pods there), or
the scheduler answered such a question with `Deleted_<time>` and the allocatable is still 0. A `Deleted_` on a
node whose kubelet offers the devices again drops nothing: HAMi's `CheckHealth` looks only for `Requesting`,
asks again and keeps serving the node. This one rule reads the clock; `hami.scheduler.handshake` applies the
same rule to decide what to write.

Owns reading only: what pods use of a node is counted by `hami.scheduler.state`, which keeps the records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.nodelease import LEASE_ANNOTATION
from hami.cluster.port import KubeObject, meta
from hami.codec import HANDSHAKE_TIME_FORMAT, AnnotationError, decode_legacy_register, decode_node_register
from hami.model import Device, DeviceKind, DeviceUsage, NodeView, RegisterFormat
from hami.plugins import VendorPlugins
from hami.quantity import cpu_millis, memory_mib, parse_quantity

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MEMO_ENTRIES",
    "NodeReader",
    "NodeReading",
    "NodeRecord",
    "NodeTotals",
    "device_allocatable",
    "handshake_dropped",
    "handshake_verdict",
]

log = logging.getLogger(__name__)

MEMO_ENTRIES = 512
"""How many evaluations a node's memo holds (shapes, classes, fits, learned-profile costs) before it is emptied."""


@dataclass
class NodeRecord:
    name: str
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    views: dict[str, NodeView]
    """kind → the node's devices of that kind with their usage."""
    pods: set[str] = field(default_factory=set)
    totals: dict[str, NodeTotals] = field(default_factory=dict)
    """kind → capacity and usage summed over the node's devices, kept current with every change."""
    cpu_allocatable: int | None = None
    """Millicores the node offers to pods (status.allocatable), None when unknown."""
    memory_allocatable: int | None = None
    """MiB the node offers to pods, None when unknown."""
    cpu_requested: int = 0
    memory_requested: int = 0
    live_pods: set[str] = field(default_factory=set)
    """Every live pod on the node (with or without devices), for CPU and memory."""
    in_flight: set[str] = field(default_factory=set)
    """The pods decided onto the node whose allocation has not finished (`awaits_allocation`): a bind to the node
    waits for their node lock, so the extender can pass the node over while another one fits. (A lock still held
    by a pod already allocated does not hold a bind back: the bind takes it over.)"""
    memo: dict[object, object] = field(default_factory=dict)
    """The filter's per-node evaluations, valid until the node's usage changes (then cleared); written through
    `remember`, which bounds it."""
    device_allocatable: dict[str, int] = field(default_factory=dict)
    """kind → the node's allocatable of the kind's count resource (status.allocatable; 0 when absent)."""
    dropped: frozenset[str] = frozenset()
    """Kinds whose devices the handshake rule drops on this node (`handshake_verdict`)."""
    inputs: object = None
    """What the record was built from, but the lock and handshake annotations (`NodeReading.inputs`)."""
    resource_version: str = ""
    """The node object's resourceVersion as last seen: a precondition for writes that rely on this record."""

    def remember(self, key: object, value: object) -> None:
        """Memoise `value` under `key` until the node changes; past `MEMO_ENTRIES` the memo starts empty again."""
        if len(self.memo) > MEMO_ENTRIES:
            self.memo.clear()
        self.memo[key] = value

    @property
    def cpu_free(self) -> int | None:
        return None if self.cpu_allocatable is None else self.cpu_allocatable - self.cpu_requested

    @property
    def memory_free(self) -> int | None:
        return None if self.memory_allocatable is None else self.memory_allocatable - self.memory_requested

    def __post_init__(self) -> None:
        for kind, view in self.views.items():
            t = self.totals[kind] = NodeTotals()
            for u in view.devices:
                t.slots += u.device.count
                t.cores += u.device.devcore
                t.memory += u.device.devmem
                t.largest = max(t.largest, (u.device.devmem, u.device.devcore))
                t.model = t.model or u.device.type
            t.group = _model_group(t.model, t.largest)


@dataclass(slots=True)
class NodeTotals:
    """A node's capacity and usage of one kind, for ordering nodes without walking their devices."""

    slots: int = 0
    cores: int = 0
    memory: int = 0
    used: int = 0
    usedcores: int = 0
    usedmem: int = 0
    signature: tuple[int, ...] | None = None
    """The sorted free shares of the node's devices (thousandths), computed on demand, reset on change."""
    largest: tuple[int, int] = (0, 0)
    """(devmem, devcore) of the node's largest device of the kind."""
    model: str = ""
    """The model of the node's devices of the kind (the first device's, for type-aware policies)."""
    group: int = 0
    """A small number standing for (model, largest): nodes alike in both share what depends only on them."""

    def share(self) -> float:
        """HAMi's node score before placement, divided by 10: used slots, cores and memory as shares, summed."""
        return (
            (self.used / self.slots if self.slots else 0.0)
            + (self.usedcores / self.cores if self.cores else 0.0)
            + (self.usedmem / self.memory if self.memory else 0.0)
        )


_MODEL_GROUPS: dict[tuple[str, tuple[int, int]], int] = {}


def _model_group(model: str, largest: tuple[int, int]) -> int:
    return _MODEL_GROUPS.setdefault((model, largest), len(_MODEL_GROUPS))


@dataclass(frozen=True)
class NodeReading:
    """What a Node object says beyond its devices, read cheaply on every node event."""

    name: str
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    resource_version: str
    cpu_allocatable: int | None
    memory_allocatable: int | None
    device_allocatable: dict[str, int]
    dropped: frozenset[str]
    inputs: object
    """What a record is built from, but the lock and handshake annotations: equal inputs, equal record."""


class _NodeFacts:
    """What every kind's reading of one Node object asks: its name, annotations and labels, and its capacity as
    strings (made once, on first use), so that a node is not taken apart again for each of the vendors' kinds."""

    def __init__(self, node: KubeObject) -> None:
        m = meta(node)
        self.node = node
        self.name = str(m.get("name", "?"))
        self.annotations: Mapping[str, str] = m.get("annotations") or {}
        self.labels: Mapping[str, str] = m.get("labels") or {}
        self._capacity: dict[str, str] | None = None

    @property
    def capacity(self) -> dict[str, str]:
        if self._capacity is None:
            raw = (self.node.get("status") or {}).get("capacity") or {}
            self._capacity = {str(k): str(v) for k, v in raw.items()}
        return self._capacity


class NodeReader:
    """Reads Node objects through the vendors' kinds."""

    def __init__(self, plugins: VendorPlugins) -> None:
        self.plugins = plugins
        self.kinds: list[DeviceKind] = plugins.kinds
        self.volatile = frozenset(
            {LOCK_ANNOTATION, LEASE_ANNOTATION}
            | {k.annotations.node_handshake for k in plugins.kinds if k.annotations.node_handshake}
        )
        """Node annotations that say nothing about its devices: a change of only these keeps the node's record."""

    def devices_of(self, node: KubeObject, kind: DeviceKind) -> list[Device]:
        """The node's devices of `kind`, from its register annotation or its capacity. Malformed → none, logged."""
        facts = _NodeFacts(node)
        if handshake_dropped(facts.annotations, kind, device_allocatable(node, kind)):
            return []
        return self._devices(node, kind, facts)

    def _devices(self, node: KubeObject, kind: DeviceKind, facts: _NodeFacts) -> list[Device]:
        """`devices_of` for a kind whose devices the handshake keeps, over facts read once per node."""
        annotations = facts.annotations
        key = kind.annotations.node_register
        if self.plugins.implements(kind.common_word, "hami_node_devices"):
            own = self.plugins.node_devices(kind.common_word, annotations, facts.name, facts.capacity, facts.labels)
            if own is not None:
                return own
        if key and key in annotations:
            try:
                if kind.register_format == RegisterFormat.LEGACY:
                    return decode_legacy_register(annotations[key], key)
                return decode_node_register(annotations[key], key)
            except AnnotationError as exc:
                log.warning("node %s: ignoring its %s devices: %s", facts.name, kind.common_word, exc)
                return []
        if kind.register_format == RegisterFormat.CAPACITY:
            return _devices_from_capacity(node, kind)
        return []

    def read(self, node: KubeObject) -> NodeReading:
        """Everything but the devices: whether they need reading again is decided by `NodeReading.inputs`."""
        m = meta(node)
        cpu, memory = _allocatable(node)
        offered = {kind.common_word: device_allocatable(node, kind) for kind in self.kinds}
        annotations = m.get("annotations") or {}
        dropped = frozenset(
            k.common_word for k in self.kinds if handshake_dropped(annotations, k, offered[k.common_word])
        )
        status = node.get("status") or {}
        labels = m.get("labels") or {}
        inputs = (
            {k: v for k, v in annotations.items() if k not in self.volatile},
            labels,
            status.get("capacity"),
            status.get("allocatable"),
            dropped,
        )
        version = str(m.get("resourceVersion") or "")
        return NodeReading(m["name"], annotations, labels, version, cpu, memory, offered, dropped, inputs)

    def record(self, node: KubeObject, reading: NodeReading) -> NodeRecord:
        """A new record of the node, its devices read, none of them used yet."""
        views: dict[str, NodeView] = {}
        facts = _NodeFacts(node)
        for kind in self.kinds:
            devices = [] if kind.common_word in reading.dropped else self._devices(node, kind, facts)
            if devices:
                views[kind.common_word] = NodeView(
                    name=reading.name,
                    devices=[DeviceUsage(device=d) for d in devices],
                    annotations=reading.annotations,
                    labels=reading.labels,
                )
        record = NodeRecord(reading.name, reading.annotations, reading.labels, views)
        record.cpu_allocatable, record.memory_allocatable = reading.cpu_allocatable, reading.memory_allocatable
        record.device_allocatable, record.dropped = reading.device_allocatable, reading.dropped
        record.inputs = reading.inputs
        record.resource_version = reading.resource_version
        return record


HANDSHAKE_TIMEOUT = timedelta(seconds=60)
"""How long a `Requesting_<time>` question stays fresh: HAMi's fixed 60 s (`pkg/device/devices.go`)."""


def handshake_verdict(
    value: str | None, allocatable: int, now: datetime, timeout: timedelta = HANDSHAKE_TIMEOUT
) -> str:
    """HAMi v2.10's handshake rule (`device.CheckHealth`) for one node and device kind: ``"wait"`` when the
    value holds a question (``Requesting``) that is fresh, unreadable, or whose node still offers the kind's
    count resource (`allocatable` > 0): the devices stay and nothing is written; ``"drop"`` when the question
    has expired and the node offers none: the devices go (the scheduler writes `Deleted_<time>`); ``"dropped"``
    for a `Deleted_<time>` on a node that still offers none: the devices stay gone and nothing is written (HAMi
    asks again here, serves the node for the question's 60 s and drops it again: a node whose kubelet offers no
    device has nothing to serve, and this project's daemon answers a `Deleted_` on its own); ``"ask"`` for
    anything else (an answer, a `Deleted_` on a node offering the devices again, nothing): a new question is
    written and the devices count. Times are local wall-clock seconds, as HAMi writes them."""
    if value is not None and value.startswith("Deleted_") and allocatable <= 0:
        return "dropped"
    if value is None or "Requesting" not in value:
        return "ask"
    _, found, when = value.partition("_")
    if not found:
        return "wait"
    try:
        asked = datetime.strptime(when, HANDSHAKE_TIME_FORMAT)
    except ValueError:
        return "wait"
    if now < asked + timeout or allocatable > 0:
        return "wait"
    return "drop"


def handshake_dropped(
    annotations: Mapping[str, str], kind: DeviceKind, allocatable: int = 0, now: datetime | None = None
) -> bool:
    """True when the node's devices of `kind` are not counted: HAMi's rule drops them (`handshake_verdict`: an
    expired question, or the scheduler's `Deleted_<time>`, while the node's allocatable for the kind's count
    resource is 0)."""
    key = kind.annotations.node_handshake
    value = annotations.get(key) if key else None
    if not value:
        return False
    return handshake_verdict(str(value), allocatable, now or datetime.now()) in ("drop", "dropped")


def device_allocatable(node: KubeObject, kind: DeviceKind) -> int:
    """The node's status.allocatable of the kind's count resource (HAMi's second condition), 0 when absent or
    unreadable."""
    offered = (node.get("status") or {}).get("allocatable") or {}
    raw = offered.get(kind.resources.count)
    if raw is None:
        return 0
    try:
        return int(parse_quantity(str(raw)))
    except (ValueError, ArithmeticError):
        return 0


def _allocatable(node: KubeObject) -> tuple[int | None, int | None]:
    status = node.get("status") or {}
    offered = status.get("allocatable") or status.get("capacity") or {}
    try:
        cpu = cpu_millis(offered["cpu"]) if "cpu" in offered else None
        memory = memory_mib(offered["memory"]) if "memory" in offered else None
    except ValueError as exc:
        log.warning("node %s: unreadable allocatable resources: %s", meta(node).get("name"), exc)
        return None, None
    return cpu, memory


def _devices_from_capacity(node: KubeObject, kind: DeviceKind) -> list[Device]:
    """Devices of a kind that publishes no register annotation: `count` from capacity (or its cores,
    `DeviceKind.capacity_cores_per_device` per device, for `DeviceKind.capacity_by_cores`, named as HAMi names
    them), memory split evenly."""
    capacity: Mapping[str, Any] = (node.get("status") or {}).get("capacity") or {}
    name = meta(node).get("name", "node")
    by_cores = kind.capacity_by_cores if kind.resources.cores else None
    try:
        # The API server stores capacities in canonical form: 2000 arrives as "2k".
        if by_cores:
            cores = int(parse_quantity(str(capacity.get(kind.resources.cores or "", "0"))))
            count = cores // kind.capacity_cores_per_device
        else:
            count = int(parse_quantity(str(capacity.get(kind.resources.count, "0"))))
        memory_units = (
            int(parse_quantity(str(capacity.get(kind.resources.memory, "0")))) if kind.resources.memory else 0
        )
    except ValueError:
        log.warning("node %s: capacity of %s is not a whole number; no devices counted", name, kind.common_word)
        return []
    if count <= 0:
        return []
    per_device = memory_units * kind.resources.memory_unit_mib // count
    if not kind.resources.memory:
        per_device = kind.capacity_memory
    return [
        Device(
            id=f"{name}-{by_cores or kind.capacity_name or kind.common_word}-{i}",
            index=i,
            count=100 if by_cores else 1,
            devmem=per_device,
            devcore=kind.capacity_cores_per_device if by_cores else 100,
            type=kind.common_word,
        )
        for i in range(count)
    ]
