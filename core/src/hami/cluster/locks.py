"""Node locks (`hami.io/mutex.lock`): one pod at a time between bind and the node side's Allocate.

The kubelet's Allocate carries no pod identity, so the node side learns which pod it is serving from the
lock on its node. This module owns taking, checking and releasing that lock through the cluster port, with
resourceVersion preconditions so two schedulers (or two binds) never both believe they hold it.

HAMi's locks get stuck for 5 minutes whenever a pod disappears between bind and allocation. Here the lock
records its owner as HAMi writes it (`<RFC3339 time>,<namespace>,<name>`, so HAMi's device plugins on a mixed
fleet can release it; a trailing `,<UID>` that earlier versions wrote is still read and honoured), and a lock
is free as soon as its owner no longer needs it:
the `holder_done` callback (the scheduler's state) says whether the owner is gone, bound elsewhere, failed
or allocated, and the scheduler also releases such locks as watch events arrive. An expired lock is taken
over. A lock held by a pod that still needs it is waited for briefly and then answered with `NodeBusy`,
which the extender turns into a retry for kube-scheduler rather than a failure.

Vendor locks (`DeviceKind.node_lock`): some of HAMi's vendors also take a lock of their own at bind, a bare
RFC 3339 time on the node that the vendor's node side removes once it served the pod. `acquire` takes those
named for the pod in the same write as the mutex (so a mixed fleet serializes as HAMi's scheduler does), waits
while another one is younger than its expiry (`VendorLockBusy`), and `release` removes, with the mutex, those of
`vendor_locks` written with it (the same time to the second: this scheduler's, not another's taken since), so a pod
that fails or vanishes before its Allocate leaves no vendor lock behind.

Lease locks (`hami.cluster.nodelease`): a node whose daemon is this project's names a Lease in
`hami.io/node-lock-lease`; a pod without vendor locks then locks the node by writing the Lease (one small write,
no Node write), and nobody releases it: its holder stops holding it as an annotation lock's owner does
(`holder_done`, or the expiry). The node annotation lock is still honoured there (a holder that still needs it is
waited for: a bind of an earlier version of this scheduler), and a Lease found gone (its daemon's Pod deleted,
HAMi's daemon in its place) sends the bind to the annotation lock. The Lease as this process last read or wrote it
is kept per node, so a bind writes without reading it first; a stale one is refused by its resourceVersion.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from hami.cluster.nodelease import LeaseRef, holder_of, lease_ref, with_holder
from hami.cluster.port import Cluster, ConflictError, KubeObject, NotFoundError, meta
from hami.codec import AnnotationError, NodeLock, decode_node_lock, encode_node_lock
from hami.errors import HamiError
from hami.model import DeviceKind

__all__ = ["LOCK_ANNOTATION", "NodeBusy", "NodeLocks", "VendorLock", "VendorLockBusy", "vendor_locks_of"]

log = logging.getLogger(__name__)

LOCK_ANNOTATION = "hami.io/mutex.lock"


class NodeBusy(HamiError):
    """The node is locked by another pod that still needs the lock."""

    def __init__(self, node: str, holder: NodeLock) -> None:
        self.node = node
        self.holder = holder
        super().__init__(f"node {node} is locked by pod {holder.namespace}/{holder.name} since {holder.time:%H:%M:%S}")


class VendorLockBusy(HamiError):
    """The node holds a vendor's own lock (`DeviceKind.node_lock`) younger than its expiry."""

    def __init__(self, node: str, annotation: str, since: datetime) -> None:
        self.node = node
        self.annotation = annotation
        super().__init__(f"node {node} is locked by {annotation} since {since:%H:%M:%S}")


VendorLock = tuple[str, timedelta]
"""A vendor lock to take: its node annotation and the age at which it is taken over."""


def vendor_locks_of(kinds: Iterable[DeviceKind]) -> list[VendorLock]:
    """The vendor locks (`DeviceKind.node_lock`) of these kinds."""
    return [(k.node_lock, timedelta(seconds=k.node_lock_seconds)) for k in kinds if k.node_lock]


def _vendor_lock_time(value: str, annotation: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        log.warning("treating the malformed node lock %s=%r as expired", annotation, value)
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class NodeLocks:
    """Take and release node locks through the cluster port."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        expiry: timedelta = timedelta(minutes=5),
        holder_done: Callable[[NodeLock, str], bool] = lambda lock, node: False,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        wait_for_node: Callable[[str, float], None] | None = None,
        known: Callable[[str], tuple[Mapping[str, str], str] | None] = lambda node: None,
    ) -> None:
        self.cluster = cluster
        self.expiry = expiry
        self.holder_done = holder_done
        self.clock = clock
        self.wait_for_node = wait_for_node or (lambda node, seconds: time.sleep(seconds))
        """Blocks until the node may have changed (a watch event) or `seconds` pass; polling by default."""
        self.known = known
        """The node's annotations and resourceVersion as a watch last delivered them, if known: each attempt
        decides and writes on them (the resourceVersion precondition refuses a stale view, and the node is then
        read), sparing a read per lock and one per wait; a busy answer is given only on the node as read."""
        self._leases: dict[str, KubeObject] = {}
        """node → its lock's Lease as last read or written here."""

    def learn_leases(self, offers: Mapping[str, LeaseRef]) -> int:
        """Read the Leases that nodes offer (node → its offer) with one list per namespace, so that each node's
        first lock is one write, not a read and a write; returns how many were learned. A Lease known here already
        is kept (it is as recent). What is learned may be behind by the time it is used: the write's
        resourceVersion precondition refuses it then, and the Lease is read."""
        wanted: dict[str, dict[str, str]] = {}
        for node, (namespace, name) in offers.items():
            if node not in self._leases:
                wanted.setdefault(namespace, {})[name] = node
        learned = 0
        for namespace, nodes in wanted.items():
            leases, _ = self.cluster.list("leases", namespace)
            for lease in leases:
                m = meta(lease)
                offered_by = nodes.get(str(m.get("name") or ""))
                if offered_by is None:
                    continue
                m.pop("managedFields", None)  # an update that leaves them out keeps them: not worth their memory
                if self._leases.setdefault(offered_by, lease) is lease:
                    learned += 1
        return learned

    def holder(self, annotations: dict[str, str]) -> NodeLock | None:
        value = annotations.get(LOCK_ANNOTATION)
        if not value:
            return None
        try:
            return decode_node_lock(value, LOCK_ANNOTATION)
        except AnnotationError as exc:
            log.warning("treating a malformed node lock as free: %s", exc)
            return None

    def _free(self, lock: NodeLock | None, node: str, namespace: str, name: str) -> bool:
        if lock is None:
            return True
        if (lock.namespace, lock.name) == (namespace, name):
            return True
        if self.clock() - lock.time > self.expiry:
            log.warning("taking over lock of %s/%s, expired since %s", lock.namespace, lock.name, lock.time)
            return True
        return self.holder_done(lock, node)

    def _vendor_busy(
        self, node: str, annotations: dict[str, str], locks: Sequence[VendorLock]
    ) -> VendorLockBusy | None:
        for annotation, expiry in locks:
            value = annotations.get(annotation)
            when = _vendor_lock_time(value, annotation) if value else None
            if when is not None and self.clock() - when <= expiry:
                return VendorLockBusy(node, annotation, when)
        return None

    def acquire(
        self,
        node: str,
        namespace: str,
        name: str,
        uid: str,
        *,
        wait: float = 5.0,
        vendor_locks: Sequence[VendorLock] = (),
    ) -> float:
        """Lock `node` for the pod (and take `vendor_locks`, see the module's docstring); returns the seconds spent
        waiting. Raises `NodeBusy` or `VendorLockBusy` after `wait` seconds."""
        start = time.monotonic()
        cached = self.known(node)
        if not vendor_locks:  # a vendor lock is a node annotation for the vendor's own node side
            if cached is None:
                cached = self._read_node(node)
            lease = lease_ref(cached[0])
            if lease is not None:
                try:
                    return self._acquire_lease(node, lease, cached[0], namespace, name, uid, wait, start)
                except NotFoundError:
                    self._leases.pop(node, None)
                    log.info("node %s: Lease %s/%s is gone; locking the node annotation", node, *lease)
                cached = None
        delay = 0.005
        while True:
            read = cached is None or not cached[1]
            if cached is not None and not read:
                annotations, version = cached
            else:
                annotations, version = self._read_node(node)
            cached = None
            annotations = dict(annotations)
            lock = self.holder(annotations)
            ours = lock is not None and (lock.namespace, lock.name) == (namespace, name)  # a retried bind
            busy = None if ours else self._vendor_busy(node, annotations, vendor_locks)
            if busy is None and self._free(lock, node, namespace, name):
                # HAMi's value, `<RFC3339>,<namespace>,<name>`, without the UID: HAMi's device plugins release a
                # lock only when it ends in `,<namespace>,<name>` (`nodelock.ReleaseNodeLock`)
                now = self.clock()
                value = encode_node_lock(NodeLock(now, namespace, name))
                taken: dict[str, str | None] = {LOCK_ANNOTATION: value}
                taken.update({a: now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for a, _ in vendor_locks})
                try:
                    self.cluster.patch_metadata("nodes", node, annotations=taken, resource_version=version or None)
                    return time.monotonic() - start
                except ConflictError:
                    continue  # the node changed under us: read again
            left = wait - (time.monotonic() - start)
            if left <= 0:
                if not read:
                    continue  # the answer comes from the node as the API server has it, not from a watch's view
                if busy is not None:
                    raise busy
                assert lock is not None
                raise NodeBusy(node, lock)
            self.wait_for_node(node, min(delay, left))
            delay = min(delay * 2, 0.1)
            cached = self.known(node)  # woken by the node's watch event, or the delay: its view, without a read

    def _read_node(self, node: str) -> tuple[Mapping[str, str], str]:
        m = meta(self.cluster.get("nodes", node))
        return m.get("annotations") or {}, str(m.get("resourceVersion") or "")

    def _acquire_lease(
        self,
        node: str,
        ref: LeaseRef,
        annotations: Mapping[str, str],
        namespace: str,
        name: str,
        uid: str,
        wait: float,
        start: float,
    ) -> float:
        """`acquire` through the node's Lease: one write when the Lease is known and free.

        :raises NotFoundError: the Lease is gone (the caller locks the node annotation)."""
        delay = 0.005
        lease = self._leases.get(node)
        behind = True  # the Lease as last written here, or as the API server's watch cache has it: maybe not the latest
        while True:
            if lease is None:
                lease = self._leases[node] = self.cluster.get("leases", ref[1], ref[0], recent=behind)
            holder = holder_of(lease)
            mutex = self.holder(dict(annotations))  # an annotation lock of an earlier scheduler, on the same view
            free = self._free(holder, node, namespace, name) and (
                mutex is None or (mutex.namespace, mutex.name) == (namespace, name) or self._free(mutex, node, "", "")
            )
            if free:
                taken = with_holder(
                    lease, NodeLock(self.clock(), namespace, name, uid), int(self.expiry.total_seconds())
                )
                try:
                    self._leases[node] = self.cluster.replace("leases", taken)
                    return time.monotonic() - start
                except ConflictError:
                    lease, behind = None, False  # changed since read here: read the latest
                    continue
            left = wait - (time.monotonic() - start)
            if left <= 0:
                if behind:
                    lease, behind = None, False  # the answer comes from the Lease as etcd has it
                    continue
                if holder is not None and not self._free(holder, node, namespace, name):
                    raise NodeBusy(node, holder)
                assert mutex is not None
                raise NodeBusy(node, mutex)
            self.wait_for_node(node, min(delay, left))  # woken by pod and node watch events
            delay = min(delay * 2, 0.1)
            known = self.known(node)
            if known is not None:
                annotations = known[0]

    def _release_lease(self, node: str, namespace: str, name: str) -> bool | None:
        """Free the node's Lease if this process last wrote it for `namespace/name`; None when it holds no Lease
        of the node (the annotation lock is then the one to release)."""
        lease = self._leases.get(node)
        holder = holder_of(lease) if lease is not None else None
        if lease is None or holder is None or (holder.namespace, holder.name) != (namespace, name):
            return None
        try:
            self._leases[node] = self.cluster.replace("leases", with_holder(lease, None, 0))
            return True
        except ConflictError:
            self._leases.pop(node, None)  # taken since by another: not ours to free
            return False
        except NotFoundError:
            self._leases.pop(node, None)
            return False

    def release(self, node: str, namespace: str, name: str, vendor_locks: Sequence[VendorLock] = ()) -> bool:
        """Release the node's lock if `namespace/name` holds it (or it is malformed), with the `vendor_locks` written
        together with it; True when released. A Lease this process took for the pod is freed instead."""
        lease_freed = self._release_lease(node, namespace, name) if not vendor_locks else None
        if lease_freed is not None:
            return lease_freed
        for _ in range(10):
            obj = self.cluster.get("nodes", node)
            m = meta(obj)
            annotations = m.get("annotations") or {}
            if LOCK_ANNOTATION not in annotations:
                return False
            lock = self.holder(annotations)
            if lock is not None and (lock.namespace, lock.name) != (namespace, name):
                return False
            freed: dict[str, str | None] = {LOCK_ANNOTATION: None}
            for annotation, _ in vendor_locks:
                value = annotations.get(annotation)
                when = _vendor_lock_time(value, annotation) if value else None
                if lock is not None and when is not None and abs((when - lock.time).total_seconds()) < 1:
                    freed[annotation] = None  # written with the mutex, by the same bind
            try:
                self.cluster.patch_metadata("nodes", node, annotations=freed, resource_version=m.get("resourceVersion"))
                return True
            except ConflictError:
                continue
        return False
