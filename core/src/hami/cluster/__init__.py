"""Access to Kubernetes: the port (`hami.cluster.port`) and its backends.

`MemoryCluster` (in-memory, for tests, the demo and the simulator) is always available; the backend on the
official `kubernetes` client lives in `hami.cluster.kube` and is imported only by services that talk to a
real API server.
"""

from hami.cluster.memory import MemoryCluster
from hami.cluster.port import (
    Cluster,
    ClusterError,
    ConflictError,
    KubeObject,
    NotFoundError,
    Resource,
    Subscription,
    WatchEvent,
    meta,
)

__all__ = [
    "Cluster",
    "ClusterError",
    "ConflictError",
    "KubeObject",
    "MemoryCluster",
    "NotFoundError",
    "Resource",
    "Subscription",
    "WatchEvent",
    "meta",
]
