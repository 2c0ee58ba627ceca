"""The scheduler's view of the cluster: every node's devices and what every live pod uses of them.

Owns the rules of usage accounting (protocol.md section 3): a node's devices come from its vendors'
register annotations (or its capacity, for kinds that publish none, or the vendor's own node annotation through
`hami_node_devices`); a pod uses what its `…-allocated`
annotations say, on the node named by `spec.nodeName` or, before binding, by `hami.io/vgpu-node`, from the
moment the filter records it until it succeeds, fails or is deleted. Within a pod, per device, init
containers count as their peak and app containers as their sum, and the pod takes the larger of the two.

State is built only from Node and Pod objects, so replaying the same objects in any order after a restart
gives exactly the same usage. The filter records its decision with `assume` before the pod's annotations
come back through the watch; the pod's own update then replaces the assumption with the same numbers. A view
of a pod older than the one counted for it (its resourceVersion is older than the counted view's or the
decision's write; or the write has not answered yet and the view does not carry the decision) changes
nothing: such views are common when kube-scheduler retries pods, and counting them would free the decided
devices for the next pod (three pods on a card with memory for two).

Each node keeps one `NodeView` per device kind, updated in place: its devices' usage, and the pods counted
there that use the kind (`NodeView.pods`, with their annotations, for fitters that honour reservations
written on pods). An assumed pod carries the annotations the filter wrote for it (`NodeFit.pod_annotations`)
until its own update arrives with all of them; after a restart the same annotations come from the pod.

With placement keys (`signer`, `hami.signing`), a pod's usage is read from what the scheduler signed, not
from annotations its owner may have rewritten: a signature that verifies gives the signed values; one that no
longer verifies (or is gone) keeps the usage already counted for the same pod UID, if it was the scheduler's
own decision; only a pod never seen signed is counted from its annotations as they stand. Each such change is
reported once to `on_mismatch` (the service makes it an event on the pod, a log line and a metric).

A node's devices of a kind are not counted while HAMi's handshake rule drops them (`handshake_verdict`): the
scheduler answered an expired question with `Deleted_<time>`, or the question `Requesting_<time>` is older
than the timeout while the node's allocatable for the kind's count resource is 0 (so a scheduler that starts
long after a node's daemon went away does not place pods there). This one rule reads the clock.

Thread-safety: one re-entrant lock (`lock`) guards everything; the filter holds it while it fits and
commits, the watch handlers while they apply an event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.port import KubeObject, meta
from hami.codec import (
    HANDSHAKE_TIME_FORMAT,
    AnnotationError,
    decode_legacy_register,
    decode_node_register,
    decode_pod_devices,
)
from hami.fitting import Grant, effective_grants
from hami.fragmentation import free_share
from hami.lifecycle import BIND_PHASE, TERMINAL_PHASES
from hami.model import (
    ContainerPlacement,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeView,
    PlacedPod,
    RegisterFormat,
    host_requests,
)
from hami.plugins import VendorHost
from hami.quantity import cpu_millis, memory_mib, parse_quantity
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignatureError, changed

__all__ = [
    "TERMINAL_PHASES",
    "VGPU_NODE_ANNOTATION",
    "ClusterState",
    "Grant",
    "NodeRecord",
    "NodeTotals",
    "PodRecord",
    "pod_key",
    "revision",
]

log = logging.getLogger(__name__)

VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


@dataclass
class PodRecord:
    key: str
    uid: str
    node: str
    init_containers: int
    allocation: dict[str, tuple[ContainerPlacement, ...]]
    """kind → positional placements, as the allocated annotations (or the filter's assumption) say."""
    grants: dict[str, dict[str, Grant]] = field(default_factory=dict)
    """kind → device UUID → effective grant (the init-container rule applied)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The pod's annotations; for an assumed pod, those the filter wrote with its decision."""
    phase: str = ""
    assumed: bool = False
    version: int | None = None
    """The resourceVersion of the pod as counted: of the view read, or of the decision's write (None until the
    write of an assumed decision answers). Views older than it are not counted."""
    bound: bool = False
    """Bound to `node`: the watch saw `spec.nodeName`, or this scheduler's bind succeeded. What the scheduler
    knows here wins over what a request body claims."""
    decided: bool = False
    """The usage is the scheduler's own decision: assumed by its filter, or read from a verified signature."""
    _placed: PlacedPod | None = field(default=None, repr=False, compare=False)

    def placed(self) -> PlacedPod:
        """The pod as node views list it (built once)."""
        if self._placed is None:
            namespace, _, name = self.key.partition("/")
            self._placed = PlacedPod(namespace=namespace, name=name, uid=self.uid, annotations=self.annotations)
        return self._placed


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
    host_pods: set[str] = field(default_factory=set)
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
    """What the record was built from, but the lock and handshake annotations (`ClusterState.set_node`)."""
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


CHANGE_LOG_LENGTH = 1 << 16
"""Entries kept in the change log before its older half is dropped (a ranking older than that is rebuilt)."""


def _model_group(model: str, largest: tuple[int, int]) -> int:
    return _MODEL_GROUPS.setdefault((model, largest), len(_MODEL_GROUPS))


class ClusterState:
    """Nodes, pods and device usage, kept current by watch events and the filter's assumptions."""

    def __init__(self, host: VendorHost) -> None:
        self.host = host
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self.host_usage: dict[str, tuple[str, int, int]] = {}
        """pod key → (node, CPU millicores, memory MiB) requested, for every live pod bound or assumed."""
        self._kinds: list[DeviceKind] = host.kinds
        self._volatile = frozenset(
            {LOCK_ANNOTATION} | {k.annotations.node_handshake for k in host.kinds if k.annotations.node_handshake}
        )
        """Node annotations that say nothing about its devices: a change of only these keeps the node's record."""
        self.free_by_model: dict[str, dict[str, int]] = {}
        """kind → device model → free share (thousandths) summed over the cluster's healthy devices, kept
        current with every change: how scarce each model is, for the fragmentation-aware policy."""
        self.signer: PlacementKeys | None = None
        """The placement keys: None reads usage from the annotations as they stand (HAMi's behaviour)."""
        self.on_mismatch: Callable[[KubeObject, str], None] = lambda pod, message: None
        """Called once per change of a pod's annotations that its signature does not cover, with why."""
        self._mismatches: dict[str, str] = {}
        self.changes: list[str] = []
        """The change log: a node's name each time what a filter evaluates of it may have changed (its devices,
        their usage, its CPU and memory), oldest first; `hami.scheduler.ranking` replays it."""
        self.changes_dropped = 0
        """How many entries were dropped from the front of `changes` (position p is `changes[p - dropped]`)."""
        self.frees = 0
        """How many changes may have given capacity back: a pod's usage or requests forgotten or shrunk, a node's
        devices or allocatable rebuilt. A filter that read a smaller count decided without them
        (`hami.scheduler.requeue`)."""

    def _changed(self, record: NodeRecord) -> None:
        """What a filter evaluates of the node may have changed: forget its memos and log it."""
        record.memo.clear()
        self._log(record.name)

    def _log(self, name: str) -> None:
        self.changes.append(name)
        if len(self.changes) > CHANGE_LOG_LENGTH:
            half = len(self.changes) // 2
            del self.changes[:half]
            self.changes_dropped += half

    @property
    def change_position(self) -> int:
        """The position after the newest entry of the change log."""
        return self.changes_dropped + len(self.changes)

    def changed_since(self, position: int) -> set[str] | None:
        """The nodes changed since `position` of the change log; None when that part of it was dropped."""
        if position < self.changes_dropped:
            return None
        return set(self.changes[position - self.changes_dropped :])

    # ---------------------------------------------------------------------------------- nodes

    def devices_of(self, node: KubeObject, kind: DeviceKind) -> list[Device]:
        """The node's devices of `kind`, from its register annotation or its capacity. Malformed → none, logged."""
        annotations: Mapping[str, str] = meta(node).get("annotations") or {}
        key = kind.annotations.node_register
        name = meta(node).get("name", "?")
        if handshake_dropped(annotations, kind, device_allocatable(node, kind)):
            return []
        own = self.host.node_devices(
            kind.common_word, annotations, name, (node.get("status") or {}).get("capacity") or {}
        )
        if own is not None:
            return own
        if key and key in annotations:
            try:
                if kind.register_format == RegisterFormat.LEGACY:
                    return decode_legacy_register(annotations[key], key)
                return decode_node_register(annotations[key], key)
            except AnnotationError as exc:
                log.warning("node %s: ignoring its %s devices: %s", name, kind.common_word, exc)
                return []
        if kind.register_format == RegisterFormat.CAPACITY:
            return _devices_from_capacity(node, kind)
        return []

    def set_node(self, node: KubeObject) -> None:
        m = meta(node)
        name = m["name"]
        cpu, memory = _allocatable(node)
        offered = {kind.common_word: device_allocatable(node, kind) for kind in self._kinds}
        annotations = m.get("annotations") or {}
        dropped = frozenset(
            k.common_word for k in self._kinds if handshake_dropped(annotations, k, offered[k.common_word])
        )
        status = node.get("status") or {}
        inputs = (
            {k: v for k, v in annotations.items() if k not in self._volatile},
            m.get("labels") or {},
            status.get("capacity"),
            status.get("allocatable"),
            dropped,
        )
        with self.lock:
            old = self.nodes.get(name)
            if old is not None and old.inputs == inputs:
                # Only the node lock or the handshake changed (two patches per bind, two per handshake round):
                # the devices, their usage and every memoised evaluation stay as they are.
                old.annotations = annotations
                old.resource_version = str(m.get("resourceVersion") or "")
                for view in old.views.values():
                    view.annotations = annotations
                return
        views: dict[str, NodeView] = {}
        for kind in self._kinds:
            devices = self.devices_of(node, kind)
            if devices:
                views[kind.common_word] = NodeView(
                    name=name,
                    devices=[DeviceUsage(device=d) for d in devices],
                    annotations=annotations,
                    labels=m.get("labels") or {},
                )
        with self.lock:
            old = self.nodes.get(name)
            record = NodeRecord(name, annotations, m.get("labels") or {}, views)
            record.cpu_allocatable, record.memory_allocatable = cpu, memory
            record.device_allocatable, record.dropped = offered, dropped
            record.inputs = inputs
            record.resource_version = str(m.get("resourceVersion") or "")
            if old is not None:
                self._count_free(old, -1)
                record.pods = old.pods
                record.host_pods = old.host_pods
                record.cpu_requested, record.memory_requested = old.cpu_requested, old.memory_requested
            self.nodes[name] = record
            self.frees += 1
            self._log(name)
            self._count_free(record, +1)
            for key in record.pods:
                self._apply(self.pods[key], +1)

    def remove_node(self, name: str) -> None:
        with self.lock:
            old = self.nodes.pop(name, None)
            if old is not None:
                self._log(name)
                self._count_free(old, -1)

    def _count_free(self, record: NodeRecord, sign: int) -> None:
        """Add (+1) or take away (-1) a node's free device shares in `free_by_model`."""
        for kind, totals in record.totals.items():
            self._add_free(kind, totals.model, sign * sum(self.signature(record, kind)))

    def _add_free(self, kind: str, model: str, delta: int) -> None:
        models = self.free_by_model.setdefault(kind, {})
        models[model] = models.get(model, 0) + delta

    # ---------------------------------------------------------------------------------- pods

    def record_of(self, pod: KubeObject) -> PodRecord | None:
        """What a pod uses, from its annotations; None when it uses no device or no longer counts."""
        m = meta(pod)
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        annotations: Mapping[str, str] = m.get("annotations") or {}
        phase = str(status.get("phase") or "")
        if phase in TERMINAL_PHASES:
            return None
        node = str(spec.get("nodeName") or annotations.get(VGPU_NODE_ANNOTATION) or "")
        if not node:
            return None
        decided = False
        if self.signer is not None:
            authentic = self._authentic(pod, node, annotations)
            if isinstance(authentic, PodRecord):
                return authentic
            annotations, decided = authentic
        total = len(spec.get("initContainers") or ()) + len(spec.get("containers") or ())
        allocation: dict[str, tuple[ContainerPlacement, ...]] = {}
        for kind in self._kinds:
            value = annotations.get(kind.annotations.allocated)
            if not value:
                continue
            try:
                placements = decode_pod_devices(value, kind.annotations.allocated)
            except AnnotationError as exc:
                log.warning(
                    "pod %s/%s: ignoring its %s usage: %s", m.get("namespace"), m.get("name"), kind.common_word, exc
                )
                continue
            if total and len(placements) != total:
                log.warning(
                    "pod %s/%s: %s lists %d containers, the pod has %d; counting it anyway",
                    m.get("namespace"), m.get("name"), kind.annotations.allocated, len(placements), total,
                )  # fmt: skip
            allocation[kind.common_word] = placements
        if not allocation:
            return None
        init = len(spec.get("initContainers") or ())
        return PodRecord(
            key=pod_key(str(m.get("namespace") or "default"), str(m.get("name"))),
            uid=str(m.get("uid") or ""),
            node=node,
            init_containers=init,
            allocation=allocation,
            grants=effective_grants(allocation, init),
            annotations=annotations,
            phase=phase,
            bound=bool(spec.get("nodeName")),
            decided=decided,
            version=revision(m.get("resourceVersion")),
        )

    def _authentic(
        self, pod: KubeObject, node: str, annotations: Mapping[str, str]
    ) -> tuple[Mapping[str, str], bool] | PodRecord:
        """The annotations to count a pod by under signed placements and whether they are the scheduler's
        decision, or the record already counted for it (kept when the signature no longer verifies)."""
        assert self.signer is not None
        m = meta(pod)
        key = pod_key(str(m.get("namespace") or "default"), str(m.get("name")))
        uid = str(m.get("uid") or "")
        with self.lock:
            previous = self.pods.get(key)
        if previous is not None and (previous.uid != uid or not previous.decided):
            previous = None
        try:
            placement = self.signer.verify(annotations, uid, node)
        except SignatureError as exc:
            if previous is not None:
                self._mismatch(pod, key, f"{exc}; keeping the usage the scheduler decided for it")
                return replace(
                    previous,
                    phase=str((pod.get("status") or {}).get("phase") or ""),
                    version=revision(m.get("resourceVersion")),
                    _placed=None,
                )
            if SIGNATURE_ANNOTATION in annotations:
                self._mismatch(pod, key, f"{exc}; counting its annotations as they stand")
            return annotations, False
        edited = changed(annotations, placement)
        if edited:
            self._mismatch(
                pod, key, f"{', '.join(edited)} changed since the scheduler signed them; counting the signed values"
            )
        else:
            self._mismatches.pop(key, None)
        return {**annotations, **placement.annotations}, True

    def _mismatch(self, pod: KubeObject, key: str, message: str) -> None:
        if self._mismatches.get(key) == message:
            return
        self._mismatches[key] = message
        try:
            self.on_mismatch(pod, message)
        except Exception:  # reporting must never stop the state from being kept
            log.exception("reporting the placement mismatch of pod %s failed", key)

    def set_pod(self, pod: KubeObject) -> None:
        m = meta(pod)
        key = pod_key(str(m.get("namespace") or "default"), str(m.get("name")))
        spec = pod.get("spec") or {}
        phase = str((pod.get("status") or {}).get("phase") or "")
        with self.lock:
            current = self.pods.get(key)
            if current is not None:
                older = _predates(current, pod, phase)
                named = str((m.get("annotations") or {}).get(VGPU_NODE_ANNOTATION) or "")
                if older or (older is None and named != current.node):
                    return  # decided without reading it (and without reporting its annotations as a mismatch)
        record = self.record_of(pod)
        node = str(spec.get("nodeName") or (m.get("annotations") or {}).get(VGPU_NODE_ANNOTATION) or "")
        with self.lock:
            current = self.pods.get(key)
            if current is not None:
                older = _predates(current, pod, phase)
                if older or (older is None and not _carries(current, record)):
                    return  # an older view of the pod than the decision counted for it
                if record is not None and record.node == current.node and current.bound and current.assumed:
                    record.bound = True  # bound by this scheduler before the watch reports nodeName
                if record is None or record.node != current.node or record.grants != current.grants:
                    self.frees += 1
            self._forget(key)
            if record is not None:
                self._remember(record)
            if node and phase not in TERMINAL_PHASES:
                self.set_host_usage(key, node, *host_requests(spec))
            else:
                self.set_host_usage(key, "", 0, 0)

    def remove_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            key = pod_key(namespace, name)
            if key in self.pods:
                self.frees += 1
            self._forget(key)
            self._mismatches.pop(key, None)
            self.set_host_usage(key, "", 0, 0)

    def set_claim(self, key: str, record: PodRecord | None) -> None:
        """Count what a DRA claim holds (`hami.scheduler.claims`) as a pod's placement; None forgets it."""
        with self.lock:
            if record is None and key in self.pods:
                self.frees += 1
            self._forget(key)
            if record is not None:
                self._remember(record)

    def set_host_usage(self, key: str, node: str, cpu: int, memory: int) -> None:
        """Count a pod's CPU and memory requests on `node` (an empty node forgets the pod)."""
        with self.lock:
            previous = self.host_usage.pop(key, None)
            if previous is not None:
                if node != previous[0] or cpu < previous[1] or memory < previous[2]:
                    self.frees += 1
                old = self.nodes.get(previous[0])
                if old is not None:
                    self._changed(old)
                    old.cpu_requested -= previous[1]
                    old.memory_requested -= previous[2]
                    old.host_pods.discard(key)
            if not node:
                return
            record = self.nodes.get(node)
            if record is None:
                record = self.nodes[node] = NodeRecord(node, {}, {}, {})
            self._changed(record)
            record.cpu_requested += cpu
            record.memory_requested += memory
            record.host_pods.add(key)
            self.host_usage[key] = (node, cpu, memory)

    def written(self, namespace: str, name: str, uid: str, version: object) -> None:
        """The decision assumed for the pod was written: events older than `version` are views from before it."""
        with self.lock:
            record = self.pods.get(pod_key(namespace, name))
            if record is not None and record.assumed and record.uid == uid:
                record.version = revision(version)

    def mark_bound(self, namespace: str, name: str, node: str) -> None:
        """The scheduler bound the pod to `node` (before the watch reports it)."""
        with self.lock:
            record = self.pods.get(pod_key(namespace, name))
            if record is not None and record.node == node:
                record.bound = True

    def assume(
        self, namespace: str, name: str, uid: str, node: str, init_containers: int,
        allocation: Mapping[str, tuple[ContainerPlacement, ...]], annotations: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Count the filter's decision at once, before the pod's annotations come back through the watch.

        `annotations` are those the decision writes on the pod beside its placement (the fits' pod
        annotations): later fits see them on the node's views until the pod's own update replaces them."""
        record = PodRecord(
            key=pod_key(namespace, name),
            uid=uid,
            node=node,
            init_containers=init_containers,
            allocation=dict(allocation),
            grants=effective_grants(allocation, init_containers),
            annotations=dict(annotations or {}),
            assumed=True,
            decided=True,
        )
        with self.lock:
            self._forget(record.key)
            self._remember(record)

    def _remember(self, record: PodRecord) -> None:
        self.pods[record.key] = record
        node = self.nodes.get(record.node)
        if node is None:
            node = self.nodes[record.node] = NodeRecord(record.node, {}, {}, {})
            self._log(record.node)
        node.pods.add(record.key)
        if awaits_allocation(record):
            node.in_flight.add(record.key)
        self._apply(record, +1)

    def _forget(self, key: str) -> None:
        record = self.pods.pop(key, None)
        if record is None:
            return
        self._apply(record, -1)
        node = self.nodes.get(record.node)
        if node is not None:
            node.pods.discard(key)
            node.in_flight.discard(key)

    def _apply(self, record: PodRecord, sign: int) -> None:
        node = self.nodes.get(record.node)
        if node is None:
            return
        for kind, grants in record.grants.items():
            view = node.views.get(kind)
            if view is None:
                continue
            totals = node.totals[kind]
            self._changed(node)
            if sign > 0:
                view.pods[record.key] = record.placed()
            else:
                view.pods.pop(record.key, None)
            freed = 0  # the change of the node's free shares (the sum of its signature), device by device
            for usage in view.devices:
                grant = grants.get(usage.device.id)
                if grant is not None:
                    device = usage.device
                    if device.health:
                        freed -= free_share(device.devmem, usage.usedmem, device.devcore, usage.usedcores)
                    usage.used += sign * grant.slots
                    usage.usedmem += sign * grant.memory
                    usage.usedcores += sign * grant.cores
                    if device.health:
                        freed += free_share(device.devmem, usage.usedmem, device.devcore, usage.usedcores)
                    totals.signature = None
                    totals.used += sign * grant.slots
                    totals.usedmem += sign * grant.memory
                    totals.usedcores += sign * grant.cores
            if freed:
                self._add_free(kind, totals.model, freed)

    # ---------------------------------------------------------------------------------- reading

    def signature(self, record: NodeRecord, kind: str) -> tuple[int, ...]:
        """The node's devices of `kind` as sorted free shares (thousandths): the key of fragmentation memos."""
        totals = record.totals[kind]
        if totals.signature is None:
            totals.signature = tuple(
                sorted(
                    free_share(u.device.devmem, u.usedmem, u.device.devcore, u.usedcores)
                    for u in record.views[kind].devices
                    if u.device.health
                )
            )
        return totals.signature

    def totals(self) -> tuple[int, int, int, int, int]:
        """Over every node's devices: memory used and total (MiB), cores used and total (%), and the pods counted
        (what `hami status` and the dashboard sum from listed objects, without listing them)."""
        memory_used = memory_total = cores_used = cores_total = 0
        with self.lock:
            for record in self.nodes.values():
                for t in record.totals.values():  # kept current with every change (`NodeTotals`)
                    memory_used += t.usedmem
                    memory_total += t.memory
                    cores_used += t.usedcores
                    cores_total += t.cores
            return memory_used, memory_total, cores_used, cores_total, len(self.pods)

    def usage_snapshot(self) -> dict[str, dict[str, dict[str, tuple[int, int, int]]]]:
        """node → kind → device → (used, usedmem, usedcores): for tests and status views."""
        with self.lock:
            return {
                name: {
                    kind: {u.device.id: (u.used, u.usedmem, u.usedcores) for u in view.devices}
                    for kind, view in record.views.items()
                }
                for name, record in self.nodes.items()
            }

    def replay(self, nodes: Iterable[KubeObject], pods: Iterable[KubeObject]) -> None:
        """Rebuild from scratch from listed objects (start-up, or after a watch was lost)."""
        with self.lock:
            self.changes.clear()
            self.changes_dropped = self.change_position + 1  # every ranking is rebuilt
            self.nodes.clear()
            self.free_by_model.clear()
            self.pods.clear()
            self.host_usage.clear()
            for node in nodes:
                self.set_node(node)
            for pod in pods:
                self.set_pod(pod)


def awaits_allocation(record: PodRecord) -> bool:
    """The pod is decided onto its node but not yet allocated there: this scheduler's assumption, a placement
    written but not yet bound, or a bind whose Allocate has not answered (`hami.io/bind-phase: allocating`). Such a
    pod holds, or is about to take, the node's lock until the node daemon's Allocate finishes."""
    if record.assumed:
        return True
    phase = record.annotations.get(BIND_PHASE)
    if phase is None:
        return not record.bound and VGPU_NODE_ANNOTATION in record.annotations
    return phase == "allocating"


def revision(value: object) -> int | None:
    """A resourceVersion as a number (etcd's revision), None when it is not one."""
    try:
        return int(str(value))
    except ValueError:
        return None


def _predates(counted: PodRecord, pod: KubeObject, phase: str) -> bool | None:
    """Whether `pod` is an older view than the one `counted` was read from (or than the write of the decision it
    assumes), so that it must not replace it. A pod ending or replaced (another UID) always counts. None while the
    write of an assumed decision has not answered: then only whether the view carries the decision tells."""
    m = meta(pod)
    if phase in TERMINAL_PHASES or (counted.uid and str(m.get("uid") or "") != counted.uid):
        return False
    if counted.assumed and counted.version is None:
        return None
    version = revision(m.get("resourceVersion"))
    return version is not None and counted.version is not None and version < counted.version


def _carries(counted: PodRecord, incoming: PodRecord | None) -> bool:
    """The view counted as `incoming` holds the decision `counted` (same node, same placements)."""
    return incoming is not None and incoming.node == counted.node and incoming.allocation == counted.allocation


HANDSHAKE_TIMEOUT = timedelta(seconds=60)
"""How long a `Requesting_<time>` question stays fresh: HAMi's fixed 60 s (`pkg/device/devices.go`)."""


def handshake_verdict(
    value: str | None, allocatable: int, now: datetime, timeout: timedelta = HANDSHAKE_TIMEOUT
) -> str:
    """HAMi v2.10's handshake rule (`device.CheckHealth`) for one node and device kind: ``"wait"`` when the
    value holds a question (``Requesting``) that is fresh, unreadable, or whose node still offers the kind's
    count resource (`allocatable` > 0): the devices stay and nothing is written; ``"drop"`` when the question
    has expired and the node offers none: the devices go (the scheduler writes `Deleted_<time>`); ``"ask"``
    for anything else (an answer, `Deleted_`, nothing): a new question is written and the devices count.
    Times are local wall-clock seconds, as HAMi writes them."""
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
    """True when the node's devices of `kind` are not counted: the scheduler dropped them (`Deleted_<time>`,
    until it asks again), or HAMi's rule drops them now (`handshake_verdict`: an expired question, and the
    node's allocatable for the kind's count resource is 0)."""
    key = kind.annotations.node_handshake
    value = annotations.get(key) if key else None
    if not value:
        return False
    if str(value).startswith("Deleted_"):
        return True
    return handshake_verdict(str(value), allocatable, now or datetime.now()) == "drop"


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
