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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from hami.cluster.port import Cluster, ConflictError, meta
from hami.codec import AnnotationError, NodeLock, decode_node_lock, encode_node_lock
from hami.errors import HamiError

__all__ = ["LOCK_ANNOTATION", "NodeBusy", "NodeLocks"]

log = logging.getLogger(__name__)

LOCK_ANNOTATION = "hami.io/mutex.lock"


class NodeBusy(HamiError):
    """The node is locked by another pod that still needs the lock."""

    def __init__(self, node: str, holder: NodeLock) -> None:
        self.node = node
        self.holder = holder
        super().__init__(f"node {node} is locked by pod {holder.namespace}/{holder.name} since {holder.time:%H:%M:%S}")


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
        """The node's annotations and resourceVersion as a watch last delivered them, if known: the first attempt
        writes on them (the resourceVersion precondition refuses a stale view), sparing a read per lock."""

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

    def acquire(self, node: str, namespace: str, name: str, uid: str, *, wait: float = 5.0) -> float:
        """Lock `node` for the pod; returns the seconds spent waiting. Raises `NodeBusy` after `wait` seconds."""
        start = time.monotonic()
        delay = 0.005
        cached = self.known(node)
        while True:
            if cached is not None and cached[1]:
                annotations, version = cached
            else:
                m = meta(self.cluster.get("nodes", node))
                annotations, version = m.get("annotations") or {}, str(m.get("resourceVersion") or "")
            cached = None
            lock = self.holder(dict(annotations))
            if self._free(lock, node, namespace, name):
                # HAMi's value, `<RFC3339>,<namespace>,<name>`, without the UID: HAMi's device plugins release a
                # lock only when it ends in `,<namespace>,<name>` (`nodelock.ReleaseNodeLock`)
                value = encode_node_lock(NodeLock(self.clock(), namespace, name))
                try:
                    self.cluster.patch_metadata(
                        "nodes", node, annotations={LOCK_ANNOTATION: value}, resource_version=version or None
                    )
                    return time.monotonic() - start
                except ConflictError:
                    continue  # the node changed under us: read again
            assert lock is not None
            left = wait - (time.monotonic() - start)
            if left <= 0:
                raise NodeBusy(node, lock)
            self.wait_for_node(node, min(delay, left))
            delay = min(delay * 2, 0.1)

    def release(self, node: str, namespace: str, name: str) -> bool:
        """Release the node's lock if `namespace/name` holds it (or it is malformed); True when released."""
        for _ in range(10):
            obj = self.cluster.get("nodes", node)
            m = meta(obj)
            annotations = m.get("annotations") or {}
            if LOCK_ANNOTATION not in annotations:
                return False
            lock = self.holder(annotations)
            if lock is not None and (lock.namespace, lock.name) != (namespace, name):
                return False
            try:
                self.cluster.patch_metadata(
                    "nodes", node, annotations={LOCK_ANNOTATION: None}, resource_version=m.get("resourceVersion")
                )
                return True
            except ConflictError:
                continue
        return False
