"""The dashboard's view model: what each page shows, computed from one read of the cluster.

Owns turning a `Snapshot` (the Node, Pod and Event objects listed at one moment, with the `ClusterStatus` that
`hami status` computes from them: the scheduler's own accounting) into the figures of the four pages: the
cluster (devices per vendor and model, memory and cores allocated against total, fragmentation, pods waiting and
why), a node (its devices with their shares, NUMA and topology, its lock), a device (the pods sharing it with
their grants) and a pod (placement, bind phase, events, the reason it is unschedulable). Pure functions of the
snapshot: nothing here talks to the cluster or renders HTML, so the figures are tested without a browser.

A lookup of a name the snapshot lacks raises `UnknownObject` with what exists, for a page that says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from hami.cluster.port import KubeObject, meta
from hami.status import BIND_PHASE, BIND_TIME, ClusterStatus, DeviceStatus, NodeStatus, PodShare, status_of

__all__ = [
    "DeviceView",
    "GroupView",
    "PendingPod",
    "PodView",
    "Snapshot",
    "UnknownObject",
    "cluster_view",
    "device_view",
    "node_view",
    "pod_view",
    "memoised",
    "take_snapshot",
]

NODE_ANNOTATION_SUFFIX = "-node"
"""HAMi's `hami.io/vgpu-node` (and the vendors' `…-node`): where the scheduler placed the pod."""


class UnknownObject(LookupError):
    """A URL names a node, device or pod the cluster does not have; `known` lists what it has."""

    def __init__(self, what: str, name: str, known: Iterable[str]) -> None:
        self.what, self.name, self.known = what, name, sorted(known)
        super().__init__(f"the cluster has no {what} {name!r}")


@dataclass(frozen=True)
class Snapshot:
    """The cluster as read at `taken`: the listed objects and their accounting."""

    taken: datetime
    nodes: tuple[KubeObject, ...]
    pods: tuple[KubeObject, ...]
    events: tuple[KubeObject, ...]
    status: ClusterStatus
    vendors: Mapping[str, str] = field(default_factory=dict)
    """Device kind (common word) → the vendor's name (`VendorInfo.display_name`), for the pages' Vendor column."""
    asks: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    """Resource name → (device kind, what it asks: `count`, `memory`, `percentage` or `cores`, MiB per unit)."""
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    """What the pages computed from this snapshot (`memoised`): a snapshot is read at most once a second and every
    page and viewer in between reads the same one, so each figure is worked out once per snapshot."""

    @property
    def version(self) -> str:
        """Changes whenever a listed object changes (their resourceVersions), for the pages' live updates."""
        return memoised(self, "version", self._version)

    def _version(self) -> str:
        parts = []
        for kind, objects in (("n", self.nodes), ("p", self.pods), ("e", self.events)):
            for obj in objects:
                m = obj.get("metadata") or {}
                parts.append(f"{kind}/{m.get('namespace')}/{m.get('name')}/{m.get('resourceVersion')};")
        return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]  # one update: 9,000 objects in 10 ms


T = TypeVar("T")


def memoised(snapshot: Snapshot, key: object, make: Callable[[], T]) -> T:
    """`make()` once per snapshot and `key` (a figure is a pure function of the snapshot and what the key names)."""
    try:
        return snapshot.memo[key]  # type: ignore[return-value]
    except KeyError:
        value = snapshot.memo[key] = make()
        return value


def take_snapshot(
    nodes: Iterable[KubeObject],
    pods: Iterable[KubeObject],
    events: Iterable[KubeObject],
    plugins: Any,
    *,
    now: datetime | None = None,
    leases: Iterable[KubeObject] = (),
) -> Snapshot:
    now = now or datetime.now(UTC)
    nodes, pods = tuple(nodes), tuple(pods)
    vendors: dict[str, str] = {}
    asks: dict[str, tuple[str, str, int]] = {}
    for kind in getattr(plugins, "kinds", ()):
        word = kind.common_word
        vendors[word] = plugins.owner(word).info.display_name
        names = kind.resources
        for role, resource in (
            ("count", names.count),
            ("memory", names.memory),
            ("percentage", names.memory_percentage),
            ("cores", names.cores),
        ):
            if resource:
                asks[resource] = (word, role, names.memory_unit_mib)
    return Snapshot(
        now, nodes, pods, tuple(events), status_of(nodes, pods, plugins, now=now, leases=leases), vendors, asks
    )


# --------------------------------------------------------------------------------------------------------
# The cluster page
# --------------------------------------------------------------------------------------------------------


@dataclass
class GroupView:
    """The devices of one vendor kind and model, summed."""

    kind: str
    model: str
    vendor: str = ""
    devices: int = 0
    healthy: int = 0
    memory_used: int = 0
    memory_total: int = 0
    cores_used: int = 0
    cores_total: int = 0
    shares: int = 0
    idle: int = 0
    full: int = 0
    largest_free: int = 0
    free_on_partial: int = 0

    @property
    def memory_free(self) -> int:
        return self.memory_total - self.memory_used

    @property
    def fragmentation(self) -> int:
        """Percent of the free memory that sits on devices already partly used (a whole-device request can't
        have it)."""
        return 100 * self.free_on_partial // self.memory_free if self.memory_free else 0


@dataclass(frozen=True)
class PendingPod:
    namespace: str
    name: str
    reason: str
    since: str = ""


@dataclass
class ClusterView:
    groups: list[GroupView] = field(default_factory=list)
    nodes: list[NodeStatus] = field(default_factory=list)
    pending: list[PendingPod] = field(default_factory=list)
    pods: int = 0

    @property
    def memory_used(self) -> int:
        return sum(g.memory_used for g in self.groups)

    @property
    def memory_total(self) -> int:
        return sum(g.memory_total for g in self.groups)

    @property
    def cores_used(self) -> int:
        return sum(g.cores_used for g in self.groups)

    @property
    def cores_total(self) -> int:
        return sum(g.cores_total for g in self.groups)

    @property
    def devices(self) -> int:
        return sum(g.devices for g in self.groups)

    @property
    def node_memory(self) -> list[tuple[NodeStatus, int, int]]:
        """Each node with the memory granted on its devices and their total (the Nodes table)."""
        return [(n, sum(d.memory_used for d in n.devices), sum(d.memory_total for d in n.devices)) for n in self.nodes]


def cluster_view(snapshot: Snapshot) -> ClusterView:
    return memoised(snapshot, "cluster", lambda: _cluster_view(snapshot))


def _cluster_view(snapshot: Snapshot) -> ClusterView:
    groups: dict[tuple[str, str], GroupView] = {}
    for node in snapshot.status.nodes:
        for d in node.devices:
            g = groups.setdefault(
                (d.kind, d.type), GroupView(kind=d.kind, model=d.type, vendor=snapshot.vendors.get(d.kind, d.kind))
            )
            free = d.memory_total - d.memory_used
            g.devices += 1
            g.healthy += d.health
            g.memory_used += d.memory_used
            g.memory_total += d.memory_total
            g.cores_used += d.cores_used
            g.cores_total += d.cores_total
            g.shares += d.shared_by
            g.idle += d.shared_by == 0
            g.full += free <= 0 or d.shared_by >= d.split or d.cores_used >= d.cores_total > 0
            g.largest_free = max(g.largest_free, free)
            if d.shared_by and free > 0:
                g.free_on_partial += free
    return ClusterView(
        groups=[groups[k] for k in sorted(groups)],
        nodes=list(snapshot.status.nodes),
        pending=pending_pods(snapshot),
        pods=snapshot.status.pods,
    )


def _pod_key(pod: KubeObject) -> tuple[str, str]:
    m = meta(pod)
    return str(m.get("namespace") or "default"), str(m.get("name"))


def _phase(pod: KubeObject) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _events_of(snapshot: Snapshot, namespace: str, name: str) -> list[KubeObject]:
    found = [
        e
        for e in snapshot.events
        if (e.get("involvedObject") or {}).get("name") == name
        and ((e.get("involvedObject") or {}).get("namespace") or "default") == namespace
    ]
    return sorted(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def unschedulable_reason(pod: KubeObject, events: list[KubeObject]) -> str:
    """Why a pod has no node: kube-scheduler's PodScheduled condition, else its last FailedScheduling event."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "unschedulable")
    failed = [e for e in events if e.get("reason") == "FailedScheduling"]
    if failed:
        return str(failed[-1].get("message") or "FailedScheduling")
    return ""


def _wants_devices(pod: KubeObject, resources: frozenset[str]) -> bool:
    spec = pod.get("spec") or {}
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        limits = (container.get("resources") or {}).get("limits") or {}
        if any(r in resources for r in limits):
            return True
    return False


def _device_resources(snapshot: Snapshot) -> frozenset[str]:
    names: set[str] = set()
    for node in snapshot.nodes:
        names.update(((node.get("status") or {}).get("allocatable") or {}).keys())
    return frozenset(n for n in names if "/" in n)


def pending_pods(snapshot: Snapshot) -> list[PendingPod]:
    """Live pods without a node that ask for devices (or for this scheduler), with the reason they wait."""
    return memoised(snapshot, "pending", lambda: _pending_pods(snapshot))


def _pending_pods(snapshot: Snapshot) -> list[PendingPod]:
    resources = _device_resources(snapshot)
    pending = []
    for pod in snapshot.pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or _phase(pod) != "Pending":
            continue
        if not (_wants_devices(pod, resources) or str(spec.get("schedulerName") or "").startswith("hami")):
            continue
        namespace, name = _pod_key(pod)
        reason = unschedulable_reason(pod, _events_of(snapshot, namespace, name)) or "waiting for the scheduler"
        pending.append(PendingPod(namespace, name, reason, str(meta(pod).get("creationTimestamp") or "")))
    return sorted(pending, key=lambda p: (p.namespace, p.name))


# --------------------------------------------------------------------------------------------------------
# The node and device pages
# --------------------------------------------------------------------------------------------------------


def node_view(snapshot: Snapshot, name: str) -> tuple[NodeStatus, dict[str, str]]:
    """The node's status, and its labels that say where its devices sit (NUMA, topology, vendor)."""
    for node in snapshot.status.nodes:
        if node.name == name:
            obj = next(n for n in snapshot.nodes if meta(n).get("name") == name)
            labels = meta(obj).get("labels") or {}
            return node, {k: str(v) for k, v in sorted(labels.items()) if not k.startswith("kubernetes.io/")}
    raise UnknownObject("node", name, (n.name for n in snapshot.status.nodes))


@dataclass(frozen=True)
class DeviceView:
    node: str
    device: DeviceStatus
    links: tuple[tuple[str, int], ...] = ()
    """Link scores to the node's other devices (higher: faster link), when the node publishes them."""


LINK_SCORE_SUFFIX = "-score"
"""Node annotations `hami.io/node-<vendor>-score` carry the vendors' link scores between devices."""


def device_view(snapshot: Snapshot, uuid: str) -> DeviceView:
    from hami.codec import AnnotationError, decode_link_scores

    for node in snapshot.status.nodes:
        for device in node.devices:
            if device.uuid != uuid:
                continue
            links: dict[str, int] = {}
            obj = next(n for n in snapshot.nodes if meta(n).get("name") == node.name)
            for key, value in (meta(obj).get("annotations") or {}).items():
                if not key.endswith(LINK_SCORE_SUFFIX) or not value:
                    continue
                try:
                    links.update(decode_link_scores(value, key).get(uuid, {}))
                except AnnotationError:  # a malformed annotation is the scheduler's to report
                    continue
            return DeviceView(node.name, device, tuple(sorted(links.items())))
    raise UnknownObject("device", uuid, (d.uuid for n in snapshot.status.nodes for d in n.devices))


# --------------------------------------------------------------------------------------------------------
# The pod page
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    node: str
    device: str
    kind: str
    memory: int
    cores: int
    containers: int


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    phase: str
    node: str
    scheduled_node: str
    bind_phase: str
    bound_seconds: float | None
    placements: tuple[Placement, ...]
    events: tuple[Mapping[str, str], ...]
    unschedulable: str
    requests: tuple[tuple[str, str, str], ...]


def pod_view(snapshot: Snapshot, namespace: str, name: str) -> PodView:
    pod = next((p for p in snapshot.pods if _pod_key(p) == (namespace, name)), None)
    if pod is None:
        raise UnknownObject("pod", f"{namespace}/{name}", ("/".join(_pod_key(p)) for p in snapshot.pods))
    annotations: Mapping[str, str] = meta(pod).get("annotations") or {}
    spec = pod.get("spec") or {}
    placements = []
    for node in snapshot.status.nodes:
        for d in node.devices:
            share: PodShare | None = next((s for s in d.pods if (s.namespace, s.name) == (namespace, name)), None)
            if share is not None:
                placements.append(Placement(node.name, d.uuid, d.kind, share.memory, share.cores, share.containers))
    events = _events_of(snapshot, namespace, name)
    bound = annotations.get(BIND_TIME, "")
    requests = []
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        for resource, value in sorted(((container.get("resources") or {}).get("limits") or {}).items()):
            if "/" in resource:
                requests.append((str(container.get("name")), resource, str(value)))
    return PodView(
        namespace=namespace,
        name=name,
        phase=_phase(pod),
        node=str(spec.get("nodeName") or ""),
        scheduled_node=next((v for k, v in annotations.items() if k.endswith(NODE_ANNOTATION_SUFFIX) and v), ""),
        bind_phase=annotations.get(BIND_PHASE, ""),
        bound_seconds=max(0.0, snapshot.taken.timestamp() - int(bound)) if bound.isdigit() else None,
        placements=tuple(placements),
        events=tuple(
            {
                "type": str(e.get("type") or "Normal"),
                "reason": str(e.get("reason") or ""),
                "message": str(e.get("message") or ""),
                "time": str(e.get("lastTimestamp") or e.get("eventTime") or ""),
            }
            for e in events
        ),
        unschedulable="" if spec.get("nodeName") else unschedulable_reason(pod, events),
        requests=tuple(requests),
    )
