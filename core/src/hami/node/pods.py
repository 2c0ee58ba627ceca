"""The pods this node has served: their containers for the monitor, and `hami_release` when they finish.

Allocate records every container it gives devices to. At start-up the daemon also lists the pods bound to
this node once, so a restarted daemon still knows the containers it served before. A periodic sweep reads
each tracked pod (one GET per pod on this node, never a cluster-wide list) and, when the pod is gone,
replaced (another UID), or has finished, calls the vendors' `hami_release` once with the pod's placements
and forgets it.

Thread-safe: Allocate (a worker thread), the sweep and the monitor's scrapes use it concurrently.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from hami.cluster.port import Cluster, ClusterError, KubeObject, NotFoundError, meta
from hami.codec import AnnotationError, decode_pod_devices
from hami.isolation.grant import grant_host_dir
from hami.model import ContainerPlacement, Pod
from hami.plugins import VendorPlugins

__all__ = ["ServedContainer", "ServedPods", "finished", "node_of"]

log = logging.getLogger(__name__)

VGPU_NODE = "hami.io/vgpu-node"
_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class ServedContainer:
    """One container of a pod, the devices of one kind it was given, and where it sits in the pod."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    index: int
    """Position among the pod's containers, init containers first."""
    kind: str
    devices: ContainerPlacement
    accounting_file: str | None = None
    """Host path of the container's accounting file, from the vendor's container edits."""
    grant_dir: str | None = None
    """Host path of the container's grant directory (mounted read-only at /etc/hami/grant), from its edits."""


def node_of(obj: KubeObject) -> str:
    """The node a pod is bound (or being bound) to: `spec.nodeName`, else HAMi's `hami.io/vgpu-node`."""
    node = (obj.get("spec") or {}).get("nodeName")
    if node:
        return str(node)
    return str((meta(obj).get("annotations") or {}).get(VGPU_NODE) or "")


def finished(obj: KubeObject) -> bool:
    """Whether the pod has finished (Succeeded or Failed)."""
    return (obj.get("status") or {}).get("phase") in _FINISHED


class ServedPods:
    """Served containers by pod UID."""

    def __init__(self, plugins: VendorPlugins) -> None:
        self.plugins = plugins
        self._lock = threading.Lock()
        self._pods: dict[str, list[ServedContainer]] = {}

    def record(self, container: ServedContainer) -> None:
        with self._lock:
            entries = self._pods.setdefault(container.pod_uid, [])
            entries[:] = [e for e in entries if (e.index, e.kind) != (container.index, container.kind)]
            entries.append(container)

    def containers(self) -> list[ServedContainer]:
        with self._lock:
            return [c for entries in self._pods.values() for c in entries]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    def load(self, pods: Iterable[KubeObject], node: str) -> int:
        """Track the running pods of `node` whose allocation is recorded; returns how many were found."""
        found = 0
        for obj in pods:
            if node_of(obj) != node or (obj.get("status") or {}).get("phase") in _FINISHED:
                continue
            pod = Pod.from_api(obj)
            containers = pod.all_containers
            for kind in self.plugins.kinds:
                value = pod.annotations.get(kind.annotations.allocated)
                if not value:
                    continue
                try:
                    placements = decode_pod_devices(value, kind.annotations.allocated)
                except AnnotationError as exc:
                    log.warning("pod %s/%s: %s", pod.namespace, pod.name, exc)
                    continue
                for index, devices in enumerate(placements):
                    if devices and index < len(containers):
                        name = containers[index].name
                        accounting, grant = self._edited_paths(kind.common_word, pod, index, devices)
                        self.record(
                            ServedContainer(
                                pod.namespace, pod.name, pod.uid, name, index, kind.common_word, devices, accounting,
                                grant,
                            )
                        )  # fmt: skip
                        found += 1
        return found

    def _edited_paths(
        self, kind: str, pod: Pod, index: int, devices: ContainerPlacement
    ) -> tuple[str | None, str | None]:
        """Where the vendor put the container's accounting file and grant directory (container edits are
        deterministic)."""
        try:
            edits = self.plugins.container_edits(kind, pod, index, devices)
        except Exception:  # a vendor failing here must not stop the daemon from tracking the pod
            log.warning(
                "pod %s/%s: cannot tell where container %d's accounting file is", pod.namespace, pod.name, index
            )
            return None, None
        return edits.accounting_file, grant_host_dir(edits.mounts)

    def sweep(self, cluster: Cluster) -> list[str]:
        """Release and forget the tracked pods that are gone, replaced or finished; returns their `ns/name`."""
        with self._lock:
            tracked = {uid: list(entries) for uid, entries in self._pods.items()}
        done = []
        for uid, entries in tracked.items():
            first = entries[0]
            try:
                obj = cluster.get("pods", first.pod, first.namespace)
            except NotFoundError:
                obj = None
            except ClusterError as exc:
                log.warning("cannot check pod %s/%s (%s); trying again later", first.namespace, first.pod, exc)
                continue
            same = obj if obj is not None and meta(obj).get("uid") == uid else None
            if same is not None and (same.get("status") or {}).get("phase") not in _FINISHED:
                continue
            self._release(entries, same)
            with self._lock:
                self._pods.pop(uid, None)
            done.append(f"{first.namespace}/{first.pod}")
        return done

    def _release(self, entries: list[ServedContainer], obj: KubeObject | None) -> None:
        first = entries[0]
        if obj is not None:
            pod = Pod.from_api(obj)
        else:
            pod = Pod(name=first.pod, namespace=first.namespace, uid=first.pod_uid)
        size = max(len(pod.all_containers), *(e.index + 1 for e in entries))
        for kind in sorted({e.kind for e in entries}):
            placements: list[ContainerPlacement] = [() for _ in range(size)]
            for e in entries:
                if e.kind == kind:
                    placements[e.index] = e.devices
            try:
                self.plugins.release(kind, pod, placements)
            except Exception:  # a vendor's failure must not stop the sweep
                log.exception("vendor release of %s devices for pod %s/%s failed", kind, first.namespace, first.pod)
