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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from hami.cluster.port import Cluster, ConflictError, meta
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
        delay = 0.005
        cached = self.known(node)
        while True:
            read = cached is None or not cached[1]
            if cached is not None and not read:
                annotations, version = cached
            else:
                m = meta(self.cluster.get("nodes", node))
                annotations, version = m.get("annotations") or {}, str(m.get("resourceVersion") or "")
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

    def release(self, node: str, namespace: str, name: str, vendor_locks: Sequence[VendorLock] = ()) -> bool:
        """Release the node's lock if `namespace/name` holds it (or it is malformed), with the `vendor_locks` written
        together with it; True when released."""
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
