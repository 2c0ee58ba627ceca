"""The kubelet of one end-to-end node: the device manager's side (`hami.testing.kubelet.FakeKubelet`) plus the
node-status and pod-lifecycle side, against a real API server.

Owns what a kubelet does that the product depends on, and nothing about containers:

* the Node object: created as a kubelet registers it (labels, Ready, cpu/memory/pods capacity; the not-ready
  taint lifted as the node lifecycle controller would), and the device-plugin resources' capacity/allocatable
  kept equal to the healthy devices each plugin lists;
* pods bound to the node (a watch with `spec.nodeName=<node>`): for each new pod, containers in order (init
  first), for each device-plugin resource the container asks for, the kubelet's device choice among healthy,
  not yet assigned IDs, then `Allocate` as the kubelet calls it; the pod is then reported Running through the
  status subresource, or Failed with `UnexpectedAdmissionError` (and an event) when Allocate was refused;
* a pod being deleted (deletionTimestamp) has its device IDs returned and is removed with grace 0, as the
  kubelet does once the containers stopped.

`pause()` stops starting pods (the bind has happened, Allocate has not), for tests of what a lock does meanwhile.
`offer(resource, count)` adds devices listed by a plugin this suite does not run (HAMi's own device plugin, on a
mixed fleet) to the node's capacity; pods asking for them start without an Allocate here (that plugin serves it).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kube_rest import ApiError, KubeApi, PodWatch

from hami.model import ContainerEdits
from hami.testing.kubelet import FakeKubelet, PluginCallError

__all__ = ["NodeKubelet", "StartedPod"]

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class StartedPod:
    """What the kubelet did for one pod: per container (by name), the edits of each resource's Allocate."""

    namespace: str
    name: str
    uid: str
    edits: dict[str, dict[str, ContainerEdits]] = field(default_factory=dict)
    device_ids: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""


class NodeKubelet:
    """One node's kubelet; `start()` registers the node and begins watching its pods."""

    def __init__(self, api: KubeApi, node: str, labels: Mapping[str, str] | None = None) -> None:
        self.api = api
        self.node = node
        self.labels = dict(labels or {})
        self.devices = FakeKubelet()
        self.started: dict[str, StartedPod] = {}
        self.assigned: dict[str, dict[str, str]] = {}  # resource -> device ID -> pod uid
        self._events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._resumed = threading.Event()
        self._resumed.set()
        self._capacity: dict[str, int] = {}
        self._offered: dict[str, int] = {}
        self._watch: PodWatch | None = None
        self._worker = threading.Thread(target=self._work, name=f"kubelet-{node}", daemon=True)
        self._status_stop = threading.Event()
        self._status = threading.Thread(target=self._sync_capacity, name=f"kubelet-status-{node}", daemon=True)

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> NodeKubelet:
        self.devices.start()
        self._register_node()
        self._worker.start()
        self._status.start()
        self._watch = PodWatch(self.api, self._on_pod, field_selector=f"spec.nodeName={self.node}").start()
        return self

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        self._status_stop.set()
        self._resumed.set()
        self._events.put(None)
        self._worker.join(10)
        self._status.join(10)
        self.devices.stop()

    def pause(self) -> None:
        """Pods bound from now on wait before Allocate until `resume()`."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    def offer(self, resource: str, count: int) -> None:
        """Report `count` devices of `resource` as a device plugin outside this suite would have them listed."""
        with self._lock:
            self._offered[resource] = count

    def _register_node(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", **self.labels},
            },
        }
        try:
            self.api.create(node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._patch_status({})
        # The TaintNodesByCondition admission plugin creates the node tainted not-ready; the node lifecycle
        # controller (not running here) lifts the taint once the kubelet reports Ready.
        self.api.merge_patch("Node", self.node, {"spec": {"taints": None}})

    def _patch_status(self, devices: Mapping[str, int]) -> None:
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", **{k: str(v) for k, v in devices.items()}}
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "e2e kubelet is posting ready status",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.35.4",
                "containerRuntimeVersion": "fake://1",
                "kernelVersion": "",
                "osImage": "",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
                "kubeProxyVersion": "",
            },
        }
        self.api.merge_patch("Node", self.node, {"status": status}, sub="status")

    def _sync_capacity(self) -> None:
        """Device-plugin resources in the node's status follow the plugins' healthy devices, as the kubelet's do."""
        while not self._status_stop.wait(0.2):
            with self._lock:
                current = dict(self._offered)
            for registration in self.devices.registrations:
                listed = self.devices.devices(registration.resource)
                if listed is not None:
                    current[registration.resource] = sum(1 for d in listed if d.healthy)
            if current != self._capacity:
                try:
                    self._patch_status(current)
                    self._capacity = current
                except (ApiError, OSError) as exc:
                    log.warning("kubelet %s: node status not updated: %s", self.node, exc)

    # ---------------------------------------------------------------------------------- pods

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        self._events.put((kind, pod))

    def _work(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            kind, pod = item
            try:
                self._handle(kind, pod)
            except Exception:
                log.exception("kubelet %s: handling %s %s failed", self.node, kind, pod["metadata"].get("name"))

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            self._release(uid)
            return
        if meta.get("deletionTimestamp"):
            self._release(uid)
            try:
                self.api.delete("Pod", meta["name"], meta["namespace"], grace=0, uid=uid)
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
            return
        if uid in self.started or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        self._resumed.wait()
        try:  # what the pause let happen meanwhile: the pod may be gone
            pod = self.api.get("Pod", meta["name"], meta["namespace"])
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        if pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            return
        self._start(pod)

    def _release(self, uid: str) -> None:
        with self._lock:
            for ids in self.assigned.values():
                for device, owner in list(ids.items()):
                    if owner == uid:
                        del ids[device]

    def _choose(self, resource: str, count: int, uid: str) -> list[str]:
        """The kubelet's device manager: healthy IDs not assigned to another container, in list order."""
        listed = self.devices.devices(resource) or []
        with self._lock:
            taken = self.assigned.setdefault(resource, {})
            free = [d.id for d in listed if d.healthy and d.id not in taken]
            if len(free) < count:
                raise PluginCallError(
                    "Allocate", "UnexpectedAdmissionError", f"{resource}: {len(free)} free, {count} wanted"
                )
            chosen = free[:count]
            for device in chosen:
                taken[device] = uid
            return chosen

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        started = StartedPod(meta["namespace"], meta["name"], meta["uid"])
        served = {r.resource for r in self.devices.registrations if r.generation == self.devices.generation}
        try:
            for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
                resources = container.get("resources") or {}
                wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
                for resource in sorted(set(wanted) & served):
                    count = int(wanted[resource])
                    if count <= 0:
                        continue
                    ids = self._choose(resource, count, meta["uid"])
                    edits = self.devices.start_container(resource, count, device_ids=ids)
                    started.edits.setdefault(container["name"], {})[resource] = edits
                    started.device_ids.setdefault(container["name"], []).extend(ids)
        except (PluginCallError, LookupError) as exc:
            started.error = str(exc)
        with self._lock:
            self.started[meta["uid"]] = started
        self._report(pod, started)

    def _report(self, pod: dict[str, Any], started: StartedPod) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        now = _now()
        if started.error:
            self._release(meta["uid"])
            status: dict[str, Any] = {
                "phase": "Failed",
                "reason": "UnexpectedAdmissionError",
                "message": f"Allocate failed due to {started.error}, which is unexpected",
            }
            self.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                    "involvedObject": {
                        "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                    },
                    "reason": "UnexpectedAdmissionError",
                    "message": status["message"],
                    "type": "Warning",
                    "source": {"component": "kubelet", "host": self.node},
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                }
            )  # fmt: skip
        else:
            status = {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": now,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in spec["containers"]
                ],
            }
        try:
            self.api.merge_patch("Pod", meta["name"], {"status": status}, meta["namespace"], sub="status")
        except ApiError as exc:
            if exc.status != 404:
                raise
