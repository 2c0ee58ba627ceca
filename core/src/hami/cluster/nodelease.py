"""Node locks as `coordination.k8s.io` Leases, for nodes whose node daemon is this project's.

HAMi locks a node by writing `hami.io/mutex.lock` on the Node and removing it after Allocate: two writes of the
whole Node per placed pod, each fanned out to every node watcher of the cluster (kubelet, kube-scheduler,
controllers). This project's node daemon offers a lighter lock: a small Lease of its own, one per node, which
this project's scheduler takes in one write and nobody releases. The pod the Lease names stops holding it once
its allocation is over (`hami.io/bind-phase` success or failed, written by the daemon on the pod as it always
is), once it is gone, replaced or placed elsewhere, or once the lock expires: the scheduler judges that from
its pod watch, so the daemon's success and the lock's release are one request. Node object writes per pod: 0.

The offer. The daemon creates the Lease (`LEASE_PREFIX` + node name, in the daemon's namespace) owned by its
own Pod, and names it on the Node in `LEASE_ANNOTATION` (`<namespace>/<name>`) with its register annotations
(written once, not per pod). A scheduler that reads the annotation locks the node through the Lease; HAMi's
scheduler, which does not know it, keeps writing the node annotation lock, which this daemon still serves. When
the daemon is replaced by HAMi's, its Pod is deleted and the garbage collector deletes the Lease with it: a bind
that finds the Lease gone falls back to the node annotation lock (`NodeLocks`), so an annotation left behind
never makes HAMi's daemon look for a lock it cannot read.

The Lease's spec: `holderIdentity` `<namespace>/<name>/<uid>` of the pod, `acquireTime` and `renewTime` the
time taken, `leaseDurationSeconds` the lock's expiry; an empty holder is free.

Owns the Lease's name, the annotation and the holder's encoding, and the daemon's side (`DaemonLease`: create,
adopt, read the holder). Taking the lock is `hami.cluster.locks.NodeLocks`'s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from hami.cluster.port import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    Cluster,
    ClusterError,
    ConflictError,
    KubeObject,
    NotFoundError,
    meta,
)
from hami.codec import NodeLock

__all__ = [
    "LEASE_ANNOTATION",
    "LEASE_PREFIX",
    "DaemonLease",
    "LeaseRef",
    "holder_of",
    "lease_ref",
    "with_holder",
]

log = logging.getLogger(__name__)

LEASE_ANNOTATION = "hami.io/node-lock-lease"
"""On the Node: `<namespace>/<name>` of the Lease its daemon reads the lock from (this project's daemon only)."""
LEASE_PREFIX = "hami-node-lock-"
_DNS_LABEL = re.compile(DNS_LABEL)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
LeaseRef = tuple[str, str]
"""A Lease's namespace and name."""


def lease_ref(annotations: Mapping[str, str]) -> LeaseRef | None:
    """The Lease a node's annotations name for its lock, None when none (or not a valid namespace/name)."""
    value = annotations.get(LEASE_ANNOTATION)
    if not value:
        return None
    namespace, _, name = value.partition("/")
    if not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        log.warning("ignoring %s=%r: expected <namespace>/<lease name>", LEASE_ANNOTATION, value)
        return None
    return namespace, name


def _micro_time(t: datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 in UTC with six fraction digits."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_of(lease: KubeObject) -> NodeLock | None:
    """Who holds the lock a Lease carries, None when it is free (or unreadable: free, as a malformed node lock)."""
    spec = lease.get("spec") or {}
    identity = spec.get("holderIdentity")
    if not isinstance(identity, str) or not identity:
        return None
    fields = identity.split("/")
    when = spec.get("acquireTime") or spec.get("renewTime")
    try:
        since = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    except ValueError:
        since = None
    if len(fields) != 3 or not all(fields[:2]) or since is None:
        log.warning("treating the unreadable holder %r of Lease %s as free", identity, meta(lease).get("name"))
        return None
    return NodeLock(since if since.tzinfo else since.replace(tzinfo=UTC), fields[0], fields[1], fields[2])


def with_holder(lease: KubeObject, holder: NodeLock | None, expiry_seconds: int) -> KubeObject:
    """The Lease (its metadata kept, resourceVersion the precondition) held by `holder`, or freed by None."""
    spec = dict(lease.get("spec") or {})
    if holder is None:
        spec.pop("holderIdentity", None)
    else:
        spec["holderIdentity"] = f"{holder.namespace}/{holder.name}/{holder.uid}"
        spec["acquireTime"] = spec["renewTime"] = _micro_time(holder.time)
        spec["leaseDurationSeconds"] = expiry_seconds
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta(lease), "spec": spec}


class DaemonLease:
    """The node daemon's side: keeps its node's Lease in place (owned by the daemon's Pod) and reads its holder."""

    def __init__(self, cluster: Cluster, node: str, namespace: str, *, pod_name: str = "", pod_uid: str = "") -> None:
        self.cluster = cluster
        self.node = node
        self.namespace = namespace
        self.name = LEASE_PREFIX + node
        self.owner = (pod_name, pod_uid) if pod_name and pod_uid else None
        """The daemon's Pod, the Lease's owner: the garbage collector deletes the Lease with it."""
        self.in_place = False
        """Whether the last `ensure` found or made the Lease (what the daemon offers on its Node)."""

    @property
    def annotation(self) -> str:
        """The value of `LEASE_ANNOTATION` naming this Lease."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def usable(cls, node: str, namespace: str) -> bool:
        """Whether a Lease can be named for this node (a valid namespace, and a name within 253 characters)."""
        return bool(_DNS_LABEL.match(namespace)) and bool(_DNS_SUBDOMAIN.match(LEASE_PREFIX + node))

    def _owner_references(self) -> list[dict[str, object]]:
        if self.owner is None:
            return []
        name, uid = self.owner
        return [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]

    def ensure(self) -> bool:
        """Create the Lease, or adopt one left by an earlier daemon (its holder kept); True when it is in place.

        False (logged) when the API refuses, e.g. a chart without the daemon's Lease permission: the node then
        keeps the annotation lock."""
        self.in_place = self._ensure()
        return self.in_place

    def _ensure(self) -> bool:
        try:
            try:
                lease = self.cluster.get("leases", self.name, self.namespace)
            except NotFoundError:
                self.cluster.create(
                    "leases",
                    {
                        "metadata": {
                            "name": self.name,
                            "namespace": self.namespace,
                            "labels": {"app.kubernetes.io/component": "hami-node-lock"},
                            "ownerReferences": self._owner_references(),
                        },
                        "spec": {},
                    },
                )
                log.info("node %s: created Lease %s/%s for the node lock", self.node, self.namespace, self.name)
                return True
            owners = meta(lease).get("ownerReferences") or []
            if self.owner is not None and [o.get("uid") for o in owners] != [self.owner[1]]:
                m = meta(lease)
                m["ownerReferences"] = self._owner_references()
                self.cluster.replace("leases", {**lease, "metadata": m})
            return True
        except ConflictError:
            return True  # created or adopted meanwhile (another start of this daemon): it is in place
        except ClusterError as exc:
            log.warning(
                "node %s: cannot keep Lease %s/%s (%s): the node keeps the annotation lock (hami.io/mutex.lock)",
                self.node, self.namespace, self.name, exc,
            )  # fmt: skip
            return False

    def holder(self, *, recent: bool = False) -> NodeLock | None:
        """The pod the Lease names, None when free or absent (re-created for the next bind); `recent`: as the API
        server's watch cache has it (`Cluster.get`), which may name the pod before."""
        try:
            return holder_of(self.cluster.get("leases", self.name, self.namespace, recent=recent))
        except NotFoundError:
            self.ensure()
            return None
