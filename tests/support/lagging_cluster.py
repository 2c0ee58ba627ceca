"""A MemoryCluster whose `recent` reads can be held behind, as a kube-apiserver's watch cache may be.

`get(..., recent=True)` is answered from the API server's watch cache (`resourceVersion=0`), which trails etcd by
the time an event takes to arrive; tests of code that reads that way hold chosen objects at their current version
(`hold`) and check that what is written afterwards is still right. Reads without `recent`, and every write, see
the latest, as they do on a real API server. Counts every get, by resource and whether it was recent.
"""

from __future__ import annotations

import copy
from collections import Counter

from hami.cluster import MemoryCluster
from hami.cluster.port import KubeObject, Resource


class LaggingCluster(MemoryCluster):
    def __init__(self) -> None:
        super().__init__()
        self.held: dict[tuple[str, str | None, str], KubeObject] = {}
        self.gets: Counter[tuple[str, bool]] = Counter()

    def hold(self, resource: Resource, name: str, namespace: str | None = None) -> None:
        """Recent reads of this object answer its version now until `release_all`, whatever is written since."""
        self.held[(resource, namespace, name)] = super().get(resource, name, namespace)

    def release_all(self) -> None:
        self.held.clear()

    def get(self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False) -> KubeObject:
        self.gets[(resource, recent)] += 1
        if recent and (resource, namespace, name) in self.held:
            return copy.deepcopy(self.held[(resource, namespace, name)])
        return super().get(resource, name, namespace, recent=recent)
