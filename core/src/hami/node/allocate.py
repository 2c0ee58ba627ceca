"""The kubelet's Allocate: find the pod being started, serve its next containers, and leave the node unlocked.

Allocate carries device IDs only, no pod identity. The scheduler's bind locks the node for the pod
(`hami.io/mutex.lock`: time, namespace, name and this project's owner UID) and marks it
`hami.io/bind-phase: allocating`, so:

1. **Which pod.** The lock's owner, when that pod exists with the lock's UID and still has devices of this
   kind to allocate. A lock whose owner is gone, was recreated or has finished allocating is stale: it is
   released. Without a usable lock, the pod bound to this node with `bind-phase: allocating` and devices of
   this kind left is served only when it is the only one (HAMi takes the first it finds, which can hand one
   pod's devices to another); otherwise Allocate is refused, saying why.
2. **Which containers.** Each container request of the kubelet takes the pod's next container whose entry in
   the kind's to-allocate annotation is not empty (init containers first, HAMi's positional order), and the
   number of device IDs the kubelet gives must equal the number of devices the scheduler placed.
3. **What the container gets.** The vendor's `hami_allocate` (e.g. create a partition), then its
   `hami_container_edits` (env, mounts, device nodes, CDI names) with the vendor's isolation library as the
   daemon installed it (`hami.node.hooklib`), as they are.
4. **Annotations.** The served entries of the to-allocate annotation are emptied (positions kept; the
   `…-allocated` annotation is left for usage accounting), in the same write as the pod annotations the
   vendor's allocations returned (`Allocation.pod_annotations`, e.g. the identity of a partition it created;
   the next container of the same call already sees them). When no kind of the pod has anything left,
   `bind-phase: success` is written and the lock released. On any failure once the pod is known,
   `bind-phase: failed` is written, the lock released, and the kubelet gets an error saying what was wrong.

Every Allocate of the node runs under one lock (the node lock protocol assumes one pod at a time), in the
caller's thread: the gRPC layer calls it from a worker thread. Errors never escape as anything but
`AllocationError`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami.cluster.port import Cluster, ClusterError, KubeObject, NotFoundError, meta
from hami.codec import AnnotationError, NodeLock, decode_node_lock, decode_pod_devices, encode_pod_devices
from hami.errors import HamiError
from hami.isolation.grant import write_files
from hami.model import ContainerEdits, ContainerPlacement, IsolationLibrary, Pod
from hami.node.pods import ServedContainer, node_of
from hami.plugins import VendorHost
from hami.scheduler.extender import BIND_PHASE
from hami.scheduler.locks import LOCK_ANNOTATION, NodeLocks

__all__ = ["AllocationError", "Allocator"]

log = logging.getLogger(__name__)


class AllocationError(HamiError):
    """Allocate cannot be served; the message is what the kubelet (and the pod's events) will show."""


@dataclass
class _Target:
    """The pod being started, as read from the API (for events) and as the device logic sees it."""

    obj: KubeObject
    pod: Pod


def _entries(annotations: Mapping[str, str], key: str) -> list[ContainerPlacement]:
    value = annotations.get(key) or ""
    return list(decode_pod_devices(value, key)) if value else []


def _has_work(annotations: Mapping[str, str], key: str) -> bool:
    try:
        return any(_entries(annotations, key))
    except AnnotationError:
        return True  # malformed: let the allocation itself report it


class Allocator:
    """Serves Allocate for every device kind of one node."""

    def __init__(
        self,
        cluster: Cluster,
        host: VendorHost,
        node: str,
        *,
        on_served: Callable[[ServedContainer], None] | None = None,
        library_of: Callable[[str], IsolationLibrary | None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.node = node
        self.on_served = on_served or (lambda container: None)
        self.library_of = library_of or (lambda vendor: None)
        """Vendor name → its isolation library as installed on this host, or None."""
        self.locks = NodeLocks(cluster)
        self._serial = threading.Lock()

    def allocate(self, kind: str, requests: Sequence[Sequence[str]]) -> list[ContainerEdits]:
        """The edits for each container request (device IDs from the kubelet), in order.

        :raises AllocationError: the pod cannot be found or served; the message says why.
        """
        with self._serial:
            started = time.monotonic()
            try:
                target = self._find_pod(kind)
            except AllocationError:
                raise
            except (HamiError, ClusterError) as exc:
                raise AllocationError(f"cannot find the pod being started on node {self.node}: {exc}") from None
            except Exception as exc:
                log.exception("finding the pod to allocate on node %s failed", self.node)
                raise AllocationError(f"internal error finding the pod on node {self.node}: {exc!r}") from None
            name = f"{target.pod.namespace}/{target.pod.name}"
            try:
                edits = self._serve(kind, target, requests)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, HamiError | ClusterError) else f"internal error: {exc!r}"
                if not isinstance(exc, HamiError | ClusterError):
                    log.exception("allocating %s devices for pod %s failed", kind, name)
                self._fail(target, f"cannot allocate {kind} devices on node {self.node}: {reason}")
                raise AllocationError(f"pod {name}: {reason}") from None
            log.info(
                "allocated %d container(s) of pod %s with %s devices in %.1f ms",
                len(edits), name, kind, (time.monotonic() - started) * 1000,
            )  # fmt: skip
            return edits

    # ---------------------------------------------------------------------------------- which pod

    def _find_pod(self, kind: str) -> _Target:
        key = self.host.kind(kind).annotations.to_allocate
        node_obj = self.cluster.get("nodes", self.node)
        lock = self._lock_of(node_obj)
        owner: str | None = None
        if lock is not None and lock.name:
            owner = f"{lock.namespace}/{lock.name}"
            target = self._lock_owner(lock, key)
            if target is not None:
                return target
        candidates = []
        pods, _ = self.cluster.list("pods")
        for obj in pods:
            m = meta(obj)
            annotations = m.get("annotations") or {}
            if (
                node_of(obj) == self.node
                and annotations.get(BIND_PHASE) == "allocating"
                and (obj.get("status") or {}).get("phase") in (None, "", "Pending")
                and f"{m.get('namespace')}/{m.get('name')}" != owner
                and _has_work(annotations, key)
            ):
                candidates.append(obj)
        if len(candidates) == 1:
            obj = candidates[0]
            log.info("node %s has no usable lock; serving %s, the only pod allocating here", self.node, _name(obj))
            return _Target(obj, Pod.from_api(obj))
        if not candidates:
            held = f"the lock names pod {owner}, which has no {kind} devices left to allocate" if owner else "no lock"
            raise AllocationError(
                f"no pod is waiting for {kind} devices on node {self.node}: {held}, and no pod bound here has "
                f"bind-phase allocating with devices in {key}. Was the pod scheduled by the HAMi scheduler "
                "(schedulerName), and did its bind succeed?"
            )
        names = ", ".join(sorted(_name(o) for o in candidates))
        raise AllocationError(
            f"node {self.node} has no lock naming the pod being started, and {len(candidates)} pods are allocating "
            f"{kind} devices here ({names}): refusing to guess which one the kubelet is starting"
        )

    def _lock_of(self, node_obj: KubeObject) -> NodeLock | None:
        value = (meta(node_obj).get("annotations") or {}).get(LOCK_ANNOTATION)
        if not value:
            return None
        try:
            return decode_node_lock(value, LOCK_ANNOTATION)
        except AnnotationError as exc:
            log.warning("node %s: ignoring a malformed lock: %s", self.node, exc)
            return None

    def _lock_owner(self, lock: NodeLock, key: str) -> _Target | None:
        """The lock's owner when it is the pod to serve; releases the lock when its owner no longer needs it."""
        owner = f"{lock.namespace}/{lock.name}"
        try:
            obj = self.cluster.get("pods", lock.name, lock.namespace)
        except NotFoundError:
            log.warning("node %s is locked for pod %s, which no longer exists: releasing the lock", self.node, owner)
            self.locks.release(self.node, lock.namespace, lock.name)
            return None
        m = meta(obj)
        annotations = m.get("annotations") or {}
        if lock.uid and m.get("uid") != lock.uid:
            log.warning("node %s is locked for an earlier pod named %s (UID %s): releasing", self.node, owner, lock.uid)
            self.locks.release(self.node, lock.namespace, lock.name)
            return None
        if annotations.get(BIND_PHASE) in ("success", "failed") or not self._needs_any(annotations):
            log.warning("node %s is locked for pod %s, whose allocation is over: releasing", self.node, owner)
            self.locks.release(self.node, lock.namespace, lock.name)
            return None
        if not _has_work(annotations, key):
            return None  # the owner still allocates other kinds: it is not the pod asking for this one
        return _Target(obj, Pod.from_api(obj))

    def _needs_any(self, annotations: Mapping[str, str]) -> bool:
        return any(_has_work(annotations, k.annotations.to_allocate) for k in self.host.kinds)

    # ---------------------------------------------------------------------------------- serving

    def _serve(self, kind: str, target: _Target, requests: Sequence[Sequence[str]]) -> list[ContainerEdits]:
        pod = target.pod
        key = self.host.kind(kind).annotations.to_allocate
        entries = _entries(pod.annotations, key)
        containers = pod.all_containers
        if len(entries) > len(containers):
            raise AllocationError(
                f"{key} has {len(entries)} container entries but the pod has {len(containers)} containers"
            )
        served: list[ServedContainer] = []
        answers: list[ContainerEdits] = []
        written: dict[str, str] = {}
        library = self.library_of(self.host.owner(kind).name)
        for request in requests:
            index = next((i for i, e in enumerate(entries) if e), None)
            if index is None:
                raise AllocationError(
                    f"the kubelet asked for {len(requests)} container(s) of {kind} devices, but only {len(served)} "
                    f"had devices left in {key}"
                )
            container = containers[index].name
            placement = entries[index]
            if len(request) != len(placement):
                raise AllocationError(
                    f"container {container} was given {len(request)} {kind} device ID(s) by the kubelet, but the "
                    f"scheduler placed {len(placement)} device(s) for it ({', '.join(d.uuid for d in placement)})"
                )
            allocation = self.host.allocate(kind, pod, index, placement)
            placement = allocation.devices
            if allocation.pod_annotations:
                written.update(allocation.pod_annotations)
                pod = pod.model_copy(update={"annotations": {**pod.annotations, **allocation.pod_annotations}})
            edits = self.host.container_edits(kind, pod, index, placement, library)
            try:
                write_files(edits.files)  # the grant, before the container can start
            except OSError as exc:
                raise AllocationError(f"cannot write {exc.filename} for {container}: {exc.strerror}") from None
            answers.append(edits)
            record = ServedContainer(
                pod.namespace, pod.name, pod.uid, container, index, kind, placement, edits.accounting_file
            )
            self.on_served(record)  # before anything else can fail: what hami_allocate made is released later
            served.append(record)
            entries[index] = ()
        patched = self.cluster.patch_metadata(
            "pods", pod.name, pod.namespace, annotations={**written, key: encode_pod_devices(entries)}
        )
        if not self._needs_any(meta(patched).get("annotations") or {}):
            self.cluster.patch_metadata("pods", pod.name, pod.namespace, annotations={BIND_PHASE: "success"})
            try:
                self.locks.release(self.node, pod.namespace, pod.name)
            except ClusterError as exc:  # the pod is allocated; the scheduler frees locks of finished owners
                log.warning("pod %s/%s allocated, but releasing node %s failed: %s", pod.namespace, pod.name,
                            self.node, exc)  # fmt: skip
        return answers

    def _fail(self, target: _Target, message: str) -> None:
        """Mark the pod's binding failed, say why in an event, release the node lock if the pod holds it.

        Never raises: the kubelet must get its answer whatever the API does.
        """
        pod = target.pod
        with contextlib.suppress(Exception):
            self.cluster.patch_metadata("pods", pod.name, pod.namespace, annotations={BIND_PHASE: "failed"})
        with contextlib.suppress(Exception):
            self.cluster.record_event(target.obj, "DeviceAllocationFailed", message, warning=True)
        try:
            self.locks.release(self.node, pod.namespace, pod.name)
        except Exception:
            log.exception("could not release the lock of node %s held by %s/%s", self.node, pod.namespace, pod.name)


def _name(obj: KubeObject) -> str:
    m = meta(obj)
    return f"{m.get('namespace', 'default')}/{m.get('name', '?')}"
