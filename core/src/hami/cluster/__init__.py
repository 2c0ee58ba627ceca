"""Access to Kubernetes: the port (`hami.cluster.port`) and its two backends.

- `MemoryCluster` (`hami.cluster.memory`): in-memory, always available; what the simulator (`hami simulate`)
  schedules against, and what the demo and the tests run on.
- `KubeCluster` (`hami.cluster.kube`): the port's verbs as REST calls to a real API server, imported only by
  services that talk to one. Under it, `hami.cluster.kube_transport` reaches the server (connection pool,
  credentials from a kubeconfig or the pod's service account) and `hami.cluster.kube_watch` runs each watch.

The in-memory cluster served over HTTPS as a Kubernetes API (for the demo and tests) is testing equipment:
`hami.testing.apiserver`.
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
