"""The scheduler's view of the cluster: every node's devices and what every live pod uses of them.

Owns the rules of usage accounting (protocol.md section 3): a node's devices are read by `hami.scheduler.nodes`
(with HAMi's handshake rule), what a pod uses by `hami.scheduler.usage` (with signed placements); this module
counts the one against the other. A pod uses its devices from the moment the filter decides it until it
succeeds, fails or is deleted. Within a pod, per device, init containers count as their peak and app containers
as their sum, and the pod takes the larger of the two.

State is built only from Node and Pod objects, so replaying the same objects in any order after a restart
gives exactly the same usage. The filter counts its decision with `commit` before the pod's annotations
come back through the watch; the pod's own update then replaces the assumption with the same numbers. A view
of a pod older than the one counted for it (its resourceVersion is older than the counted view's or the
decision's write; or the write has not answered yet and the view does not carry the decision) changes
nothing: such views are common when kube-scheduler retries pods, and counting them would free the decided
devices for the next pod (three pods on a card with memory for two).

Each node keeps one `NodeView` per device kind, updated in place: its devices' usage, and the pods counted
there that use the kind (`NodeView.pods`, with their annotations, for fitters that honour reservations
written on pods). An assumed pod carries the annotations the filter wrote for it (`NodeFit.pod_annotations`)
until its own update arrives with all of them; after a restart the same annotations come from the pod.
Every change a filter's evaluation of a node may see is appended to the change log (`changes`,
`hami.scheduler.changes`), from which `hami.scheduler.ranking` keeps its rankings current.

Thread-safety: one re-entrant lock (`lock`) guards everything; the filter holds it while it fits and
commits, the watch handlers while they apply an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from hami.cluster.port import KubeObject, meta, pod_key, revision
from hami.fitting import Grant, effective_grants
from hami.fragmentation import free_share
from hami.lifecycle import TERMINAL_PHASES
from hami.model import ContainerPlacement, Pod, cpu_memory_requests
from hami.plugins import VendorPlugins
from hami.scheduler.changes import ChangeLog
from hami.scheduler.nodes import NodeReader, NodeRecord, NodeTotals
from hami.scheduler.usage import VGPU_NODE_ANNOTATION, PodRecord, PodUsage, awaits_allocation

__all__ = [
    "TERMINAL_PHASES",
    "VGPU_NODE_ANNOTATION",
    "ClusterState",
    "Decision",
    "Grant",
    "NodeRecord",
    "NodeTotals",
    "PodRecord",
    "effective_grants",
]


class Decision(NamedTuple):
    """A filter's choice for a pod: the node, the devices of each kind, and the pod annotations the chosen node's
    fits carry (`NodeFit.pod_annotations`), which the placement is written with."""

    pod: Pod
    node: str
    allocation: Mapping[str, tuple[ContainerPlacement, ...]]
    annotations: Mapping[str, str]


class ClusterState:
    """Nodes, pods and device usage, kept current by watch events and the filter's decisions."""

    def __init__(self, plugins: VendorPlugins) -> None:
        self.plugins = plugins
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self.cpu_memory: dict[str, tuple[str, int, int]] = {}
        """pod key → (node, CPU millicores, memory MiB) requested, for every live pod bound or assumed."""
        self.reader = NodeReader(plugins)
        """Reads Node objects (`hami.scheduler.nodes`)."""
        self.usage = PodUsage(plugins.kinds, self.lock, self.pods)
        """Reads what pods use, under signed placements when it has keys (`hami.scheduler.usage`)."""
        self.free_by_model: dict[str, dict[str, int]] = {}
        """kind → device model → free share (thousandths) summed over the cluster's healthy devices, kept
        current with every change: how scarce each model is, for the fragmentation-aware policy."""
        self.changes = ChangeLog()
        """A node's name each time what a filter evaluates of it may have changed (its devices, their usage, its CPU
        and memory); `hami.scheduler.ranking` replays it."""
        self.frees = 0
        """How many changes may have given capacity back: a pod's usage or requests forgotten or shrunk, a node's
        devices or allocatable rebuilt. A filter that read a smaller count decided without them
        (`hami.scheduler.requeue`)."""

    def _changed(self, record: NodeRecord) -> None:
        """What a filter evaluates of the node may have changed: forget its memos and append it to the change log."""
        record.memo.clear()
        self.changes.append(record.name)

    # ---------------------------------------------------------------------------------- nodes

    def set_node(self, node: KubeObject) -> None:
        reading = self.reader.read(node)
        name = reading.name
        with self.lock:
            old = self.nodes.get(name)
            if old is not None and old.inputs == reading.inputs:
                # Only the node lock or the handshake changed (two patches per bind, two per handshake round):
                # the devices, their usage and every memoised evaluation stay as they are.
                old.annotations = reading.annotations
                old.resource_version = reading.resource_version
                for view in old.views.values():
                    view.annotations = reading.annotations
                return
        record = self.reader.record(node, reading)
        with self.lock:
            old = self.nodes.get(name)
            if old is not None:
                self._count_free(old, -1)
                record.pods = old.pods
                record.live_pods = old.live_pods
                record.cpu_requested, record.memory_requested = old.cpu_requested, old.memory_requested
            self.nodes[name] = record
            self.frees += 1
            self.changes.append(name)
            self._count_free(record, +1)
            for key in record.pods:
                self._apply(self.pods[key], +1)

    def remove_node(self, name: str) -> None:
        with self.lock:
            old = self.nodes.pop(name, None)
            if old is not None:
                self.changes.append(name)
                self._count_free(old, -1)

    def _count_free(self, record: NodeRecord, sign: int) -> None:
        """Add (+1) or take away (-1) a node's free device shares in `free_by_model`."""
        for kind, totals in record.totals.items():
            self._add_free(kind, totals.model, sign * sum(self.signature(record, kind)))

    def _add_free(self, kind: str, model: str, delta: int) -> None:
        models = self.free_by_model.setdefault(kind, {})
        models[model] = models.get(model, 0) + delta

    # ---------------------------------------------------------------------------------- pods

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
        record = self.usage.record_of(pod)
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
                self.set_cpu_memory(key, node, *cpu_memory_requests(spec))
            else:
                self.set_cpu_memory(key, "", 0, 0)

    def remove_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            key = pod_key(namespace, name)
            if key in self.pods:
                self.frees += 1
            self._forget(key)
            self.usage.forget(key)
            self.set_cpu_memory(key, "", 0, 0)

    def set_claim(self, key: str, record: PodRecord | None) -> None:
        """Count what a DRA claim holds (`hami.scheduler.claims`) as a pod's placement; None forgets it."""
        with self.lock:
            if record is None and key in self.pods:
                self.frees += 1
            self._forget(key)
            if record is not None:
                self._remember(record)

    def set_cpu_memory(self, key: str, node: str, cpu: int, memory: int) -> None:
        """Count a pod's CPU and memory requests on `node` (an empty node forgets the pod)."""
        with self.lock:
            previous = self.cpu_memory.pop(key, None)
            if previous is not None:
                if node != previous[0] or cpu < previous[1] or memory < previous[2]:
                    self.frees += 1
                old = self.nodes.get(previous[0])
                if old is not None:
                    self._changed(old)
                    old.cpu_requested -= previous[1]
                    old.memory_requested -= previous[2]
                    old.live_pods.discard(key)
            if not node:
                return
            record = self.nodes.get(node)
            if record is None:
                record = self.nodes[node] = NodeRecord(node, {}, {}, {})
            self._changed(record)
            record.cpu_requested += cpu
            record.memory_requested += memory
            record.live_pods.add(key)
            self.cpu_memory[key] = (node, cpu, memory)

    def note_own_write(self, namespace: str, name: str, uid: str, version: object) -> None:
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
        priority: int = 0, labels: Mapping[str, str] | None = None,
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
            priority=priority,
            started=time.time(),
            labels=dict(labels or {}),
        )
        with self.lock:
            self._forget(record.key)
            self._remember(record)

    def commit(self, decision: Decision) -> Callable[[], None]:
        """Count a filter's decision at once: its devices (`assume`, with the annotations its fits carry) and the
        pod's CPU and memory on the chosen node. Returns how to take both back (nothing is left counted when this
        raises)."""
        pod, node = decision.pod, decision.node
        key = pod_key(pod.namespace, pod.name)

        def undo() -> None:
            try:
                self.set_cpu_memory(key, "", 0, 0)
            finally:
                self.remove_pod(pod.namespace, pod.name)

        try:
            with self.lock:
                self.assume(
                    pod.namespace, pod.name, pod.uid, node, len(pod.init_containers), decision.allocation,
                    decision.annotations, pod.priority, pod.labels,
                )  # fmt: skip
                self.set_cpu_memory(key, node, pod.cpu_request, pod.memory_request)
        except BaseException:
            undo()
            raise
        return undo

    def _remember(self, record: PodRecord) -> None:
        self.pods[record.key] = record
        node = self.nodes.get(record.node)
        if node is None:
            node = self.nodes[record.node] = NodeRecord(record.node, {}, {}, {})
            self.changes.append(record.node)
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
            self.changes.restart()
            self.nodes.clear()
            self.free_by_model.clear()
            self.pods.clear()
            self.cpu_memory.clear()
            for node in nodes:
                self.set_node(node)
            for pod in pods:
                self.set_pod(pod)


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
