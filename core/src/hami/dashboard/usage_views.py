"""The usage side of the dashboard's pages: grants beside what the node daemons measure, from one snapshot.

Owns putting a `Snapshot` (the scheduler's accounting) together with the node daemons' figures
(`hami.dashboard.usage.NodeUsage` per node): the overview's usage totals beside the allocation totals, the top
nodes and devices by usage and by allocation, the workloads (every pod with devices: granted against used, age,
node, devices; and per container), and the memory stranded for the pods that wait (free memory on devices that
none of the waiting pods could use, per device kind and model). Pure functions: nothing here reads the cluster or
a node, so the figures are tested without either.

A figure a node does not report stays None here and reads "unknown" on the pages; it is never summed as zero
(totals say over how many devices they are taken).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from hami.cluster.port import KubeObject, meta
from hami.dashboard.usage import ContainerUse, DeviceUse, NodeUsage
from hami.dashboard.views import Snapshot, pending_pods
from hami.quantity import parse_quantity
from hami.status import DeviceStatus

__all__ = [
    "DeviceRank",
    "device_ranks",
    "NodeRank",
    "Overview",
    "Stranded",
    "Workload",
    "overview",
    "stranded_memory",
    "top_devices",
    "node_ranks",
    "top_nodes",
    "workloads",
]


@dataclass(frozen=True)
class Overview:
    """Allocation and usage side by side, over the whole cluster."""

    memory_granted: int
    memory_total: int
    cores_granted: int
    cores_total: int
    memory_in_use: float | None
    """MiB in use on the devices that report memory; None when none does."""
    memory_reported_total: int
    """Registered MiB of the devices that report memory in use (what `memory_in_use` is a share of)."""
    busy: float | None
    """Mean busy percent over the devices that report it."""
    devices: int
    devices_reporting: int
    nodes: int
    nodes_answering: int
    power: float | None
    """Watts drawn by the devices that report power."""


def overview(snapshot: Snapshot, usage: Mapping[str, NodeUsage], ranks: Sequence[DeviceRank] | None = None) -> Overview:
    """The cluster's allocation and usage; `ranks` (`device_ranks` of the same snapshot and usage) when at hand."""
    ranks = device_ranks(snapshot, usage) if ranks is None else ranks
    in_use = [r for r in ranks if r.use is not None]
    memory = [r for r in in_use if r.use is not None and r.use.memory_used is not None]
    busy = [r.use.utilization for r in in_use if r.use is not None and r.use.utilization is not None]
    power = [r.use.power for r in in_use if r.use is not None and r.use.power is not None]
    return Overview(
        memory_granted=sum(r.device.memory_used for r in ranks),
        memory_total=sum(r.device.memory_total for r in ranks),
        cores_granted=sum(r.device.cores_used for r in ranks),
        cores_total=sum(r.device.cores_total for r in ranks),
        memory_in_use=sum(r.use.memory_used or 0.0 for r in memory if r.use is not None) if memory else None,
        memory_reported_total=sum(r.device.memory_total for r in memory),
        busy=sum(busy) / len(busy) if busy else None,
        devices=len(ranks),
        devices_reporting=len({r.device.uuid for r in in_use}),
        nodes=len(snapshot.status.nodes),
        nodes_answering=sum(1 for n in snapshot.status.nodes if n.name in usage and not usage[n.name].error),
        power=sum(power) if power else None,
    )


# --------------------------------------------------------------------------------------------------------
# Top lists
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRank:
    node: str
    device: DeviceStatus
    use: DeviceUse | None

    @property
    def allocated(self) -> float:
        """Percent of the device's memory granted."""
        return 100 * self.device.memory_used / self.device.memory_total if self.device.memory_total else 0.0

    @property
    def memory_in_use(self) -> float | None:
        """Percent of the device's memory in use, when reported."""
        if self.use is None or self.use.memory_used is None or not self.device.memory_total:
            return None
        return 100 * self.use.memory_used / self.device.memory_total


@dataclass(frozen=True)
class NodeRank:
    node: str
    devices: int
    allocated: float
    """Percent of the node's device memory granted."""
    busy: float | None
    """Mean busy percent of its devices that report it."""


def device_ranks(snapshot: Snapshot, usage: Mapping[str, NodeUsage]) -> list[DeviceRank]:
    """Every device with its node's figures for it, once per page (the top lists rank the same list)."""
    ranks: list[DeviceRank] = []
    for n in snapshot.status.nodes:
        found = usage.get(n.name)
        devices = found.devices if found is not None and not found.error else {}
        ranks.extend(DeviceRank(n.name, d, devices.get(d.uuid)) for d in n.devices)
    return ranks


def top_devices(ranks: Sequence[DeviceRank], by: str, count: int = 5) -> list[DeviceRank]:
    """The `count` devices of `ranks` (`device_ranks`) highest by `by`: `allocated` (memory granted), `busy` or
    `memory` (in use); devices that do not report a usage figure are left out of the usage lists."""

    def key(r: DeviceRank) -> float | None:
        if by == "allocated":
            return r.allocated
        if by == "busy":
            return r.use.utilization if r.use is not None else None
        return r.memory_in_use

    scored = [(-v, r.node, r.device.index, n) for n, r in enumerate(ranks) if (v := key(r)) is not None]
    return [ranks[n] for *_, n in heapq.nsmallest(count, scored)]


def node_ranks(ranks: Sequence[DeviceRank]) -> list[NodeRank]:
    """Each node's allocation and mean busy share, from its devices' ranks (`device_ranks`, node by node)."""
    out: list[NodeRank] = []
    for node, group in itertools.groupby(ranks, key=lambda r: r.node):
        devices = list(group)
        total = sum(r.device.memory_total for r in devices)
        busy = [r.use.utilization for r in devices if r.use is not None and r.use.utilization is not None]
        out.append(
            NodeRank(
                node,
                len(devices),
                100 * sum(r.device.memory_used for r in devices) / total if total else 0.0,
                sum(busy) / len(busy) if busy else None,
            )
        )
    return out


def top_nodes(nodes: Sequence[NodeRank], by: str, count: int = 5) -> list[NodeRank]:
    """The `count` nodes of `nodes` (`node_ranks`) highest by `by`: `allocated` or `busy`."""
    scored = [
        (-v, r.node, n)
        for n, r in enumerate(nodes)
        if (v := (r.allocated if by == "allocated" else r.busy)) is not None
    ]
    return [nodes[n] for *_, n in heapq.nsmallest(count, scored)]


# --------------------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """One pod holding devices: what it was granted, what it uses, where."""

    namespace: str
    name: str
    node: str
    devices: list[str] = field(default_factory=list)
    memory_granted: int = 0
    cores_granted: int = 0
    memory_used: float | None = None
    share_used: float | None = None
    """Percent of one device, summed over its devices."""
    age_seconds: float | None = None
    containers: list[ContainerUse] = field(default_factory=list)

    @property
    def memory_use_percent(self) -> float | None:
        if self.memory_used is None or not self.memory_granted:
            return None
        return 100 * self.memory_used / self.memory_granted


def _age(pod: KubeObject | None, now: datetime) -> float | None:
    stamp = str(meta(pod).get("creationTimestamp") or "") if pod is not None else ""
    try:
        return max(0.0, (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds())
    except ValueError:
        return None


def workloads(
    snapshot: Snapshot, usage: Mapping[str, NodeUsage], *, start: int = 0, count: int | None = None
) -> tuple[int, list[Workload]]:
    """Every pod placed on devices, by namespace and name, with its grants and (when its node reports) its use:
    (how many in all, the `count` from `start` on). Age and use are worked out for those returned only."""
    found: dict[tuple[str, str], Workload] = {}
    for n in snapshot.status.nodes:
        for d in n.devices:
            for share in d.pods:
                w = found.get((share.namespace, share.name))
                if w is None:
                    w = found[(share.namespace, share.name)] = Workload(share.namespace, share.name, n.name)
                w.devices.append(d.uuid)
                w.memory_granted += share.memory
                w.cores_granted += share.cores
    keys = sorted(found)
    chosen = keys[start : None if count is None else start + count]
    wanted = set(chosen)
    pods = {
        key: p
        for p in snapshot.pods
        if (key := (str(meta(p).get("namespace") or "default"), str(meta(p).get("name")))) in wanted
    }
    by_node: dict[str, dict[tuple[str, str], list[ContainerUse]]] = {}
    out = []
    for key in chosen:
        w = found[key]
        w.age_seconds = _age(pods.get(key), snapshot.taken)
        node = usage.get(w.node)
        if node is not None and not node.error:
            if w.node not in by_node:
                per: dict[tuple[str, str], list[ContainerUse]] = {}
                for c in node.containers:
                    per.setdefault((c.namespace, c.pod), []).append(c)
                by_node[w.node] = per
            w.containers = by_node[w.node].get(key, [])
            memory = [c.memory_used for c in w.containers if c.memory_used is not None]
            shares = [c.utilization for c in w.containers if c.utilization is not None]
            w.memory_used = sum(memory) if memory else None
            w.share_used = sum(shares) if shares else None
        out.append(w)
    return len(keys), out


# --------------------------------------------------------------------------------------------------------
# Memory stranded for the waiting pods
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stranded:
    """Free memory of one kind and model that none of the pods waiting for that kind could be given."""

    free: int
    stranded: int
    waiting: int
    """Pods waiting for this kind."""

    @property
    def percent(self) -> int:
        return 100 * self.stranded // self.free if self.free else 0


def _asks(snapshot: Snapshot, pod: KubeObject) -> dict[str, list[tuple[str, float]]]:
    """Device kind → per container asking for it: ("memory", MiB), ("percentage", %) or ("whole", 0) per device."""
    out: dict[str, list[tuple[str, float]]] = {}
    spec = pod.get("spec") or {}
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        limits = (container.get("resources") or {}).get("limits") or {}
        per_kind: dict[str, dict[str, float]] = {}
        for resource, value in limits.items():
            known = snapshot.asks.get(resource)
            if known is None:
                continue
            kind, role, unit = known
            try:
                amount = float(parse_quantity(value))
            except ValueError:
                continue
            per_kind.setdefault(kind, {})[role] = amount * (unit if role == "memory" else 1)
        for kind, roles in per_kind.items():
            if "memory" in roles:
                out.setdefault(kind, []).append(("memory", roles["memory"]))
            elif "percentage" in roles:
                out.setdefault(kind, []).append(("percentage", roles["percentage"]))
            elif "count" in roles:
                out.setdefault(kind, []).append(("whole", 0.0))
    return out


def _could_take(device: DeviceStatus, ask: tuple[str, float]) -> bool:
    free = device.memory_total - device.memory_used
    if device.shared_by >= device.split or free <= 0:
        return False
    what, amount = ask
    if what == "memory":
        return free >= amount
    if what == "percentage":
        return free >= device.memory_total * amount / 100
    return device.memory_used == 0


def stranded_memory(snapshot: Snapshot) -> dict[tuple[str, str], Stranded]:
    """(kind, model) → the free memory that none of the pods waiting for that kind could use on its device. Only
    kinds some pod waits for are listed: free memory nobody asks for is not stranded, just free."""
    waiting = {(p.namespace, p.name) for p in pending_pods(snapshot)}
    asks: dict[str, list[tuple[str, float]]] = {}
    pods_per_kind: dict[str, int] = {}
    for pod in snapshot.pods:
        key = (str(meta(pod).get("namespace") or "default"), str(meta(pod).get("name")))
        if key not in waiting:
            continue
        for kind, container_asks in _asks(snapshot, pod).items():
            asks.setdefault(kind, []).extend(container_asks)
            pods_per_kind[kind] = pods_per_kind.get(kind, 0) + 1
    out: dict[tuple[str, str], Stranded] = {}
    for n in snapshot.status.nodes:
        for d in n.devices:
            if d.kind not in asks:
                continue
            free = max(0, d.memory_total - d.memory_used)
            before = out.get((d.kind, d.type), Stranded(0, 0, pods_per_kind[d.kind]))
            unusable = free if free and not any(_could_take(d, a) for a in asks[d.kind]) else 0
            out[(d.kind, d.type)] = Stranded(before.free + free, before.stranded + unusable, before.waiting)
    return out


def pod_containers(usage: Mapping[str, NodeUsage], node: str, namespace: str, pod: str) -> Sequence[ContainerUse]:
    """The pod's containers as its node reports them (empty when it does not answer)."""
    found = usage.get(node)
    if found is None or found.error:
        return ()
    return [c for c in found.containers if (c.namespace, c.pod) == (namespace, pod)]
