"""A scheduler on an in-memory cluster behind its real HTTP server, and builders for HAMi nodes and pods."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

from hami.cluster import MemoryCluster, WatchEvent, meta
from hami.cluster.locks import NodeLocks
from hami.codec import encode_node_register, encode_pod_devices
from hami.model import ContainerDevice, Device
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE, ExtenderSettings
from hami.scheduler.server import ExtenderApp, ExtenderServer
from hami.scheduler.service import SchedulerService


def post_raw(port: int, path: str, body: bytes, method: str = "POST", timeout: float = 30) -> tuple[int, bytes]:
    """One request on a connection of its own to a loopback server: its status and raw body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def gpu_node(
    name: str, gpus: int = 8, memory: int = 16384, split: int = 10, model: str = "NVIDIA-A100"
) -> dict[str, Any]:
    devices = [
        Device(
            id=f"GPU-{name}-{i}",
            index=i,
            count=split,
            devmem=memory,
            devcore=100,
            type=model,
            numa=i // 4,
            mode="hami-core",
        )
        for i in range(gpus)
    ]
    return {
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_register(devices)}},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus * split)}},
    }


def gpu_pod(
    name: str,
    gpu: int = 1,
    mem: int | None = 3000,
    cores: int | None = None,
    *,
    init: list[dict[str, str]] | None = None,
    apps: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpu)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    containers = [{"name": f"c{i}", "resources": {"limits": r}} for i, r in enumerate(apps or [limits])]
    spec: dict[str, Any] = {"containers": containers, "schedulerName": "hami-scheduler"}
    if init:
        spec["initContainers"] = [{"name": f"init{i}", "resources": {"limits": r}} for i, r in enumerate(init)]
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def running_pod(
    name: str, node: str, devices: dict[int, int], priority: int, *, created: str = "2026-12-01T00:00:00Z",
    labels: dict[str, str] | None = None, cores: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """A running pod holding `devices` (GPU index → MiB) of `node`, at `priority`."""
    placement = tuple(
        ContainerDevice(uuid=f"GPU-{node}-{i}", type="NVIDIA", usedmem=mem, usedcores=cores)
        for i, mem in devices.items()
    )
    obj = gpu_pod(name, gpu=len(devices), mem=max(devices.values()))
    obj["metadata"].update(
        uid=f"uid-{name}", creationTimestamp=created, labels=labels or {},
        annotations={"hami.io/vgpu-devices-allocated": encode_pod_devices([placement]), "hami.io/vgpu-node": node},
    )  # fmt: skip
    obj["spec"].update(nodeName=node, priority=priority)
    obj["status"] = {"phase": "Running"}
    return obj


class Harness:
    """An in-memory cluster, the scheduler service, and its HTTP server on loopback."""

    def __init__(self, settings: ExtenderSettings | None = None, cluster: MemoryCluster | None = None) -> None:
        self.cluster = cluster or MemoryCluster()
        self.plugins = VendorPlugins.load(disabled=())
        # decisions written before the filter answers, as `hami scheduler` writes them
        self.settings = settings or ExtenderSettings(bind_lock_wait_seconds=0.5)
        self.service: SchedulerService | None = None
        self.server: ExtenderServer | None = None
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> Harness:
        self.service = SchedulerService(self.cluster, self.plugins, self.settings).start()
        deadline = time.monotonic() + 30
        while not self.service.ready and time.monotonic() < deadline:  # its first list replayed, as /readyz says
            time.sleep(0.005)
        app = ExtenderApp(self.service.extender, ready=lambda: self.service is not None and self.service.ready)
        self.server = ExtenderServer(app, ("127.0.0.1", 0)).start()
        return self

    def stop(self) -> None:
        if self._conn:
            self._conn.close()
        if self.server:
            self.server.stop()
        if self.service:
            self.service.stop()

    def restart(self) -> Harness:
        self.stop()
        self._conn = None
        return self.start()

    def post(self, verb: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
        assert self.server is not None
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        data = raw if raw is not None else json.dumps(body).encode()
        self._conn.request("POST", f"/{verb}", body=data, headers={"Content-Type": "application/json"})
        response = self._conn.getresponse()
        return response.status, json.loads(response.read())

    def add_node(self, node: dict[str, Any]) -> None:
        self.cluster.create("nodes", node)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.cluster.create("pods", pod)

    def filter(self, pod_name: str, nodes: list[str] | None = None, namespace: str = "default") -> dict[str, Any]:
        pod = self.cluster.get("pods", pod_name, namespace)
        names = nodes if nodes is not None else [meta(n)["name"] for n in self.cluster.list("nodes")[0]]
        status, answer = self.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert status == 200, answer
        return dict(answer)

    def bind(self, pod_name: str, node: str, namespace: str = "default") -> dict[str, Any]:
        pod = self.cluster.get("pods", pod_name, namespace)
        body = {"PodName": pod_name, "PodNamespace": namespace, "PodUID": meta(pod)["uid"], "Node": node}
        status, answer = self.post("bind", body)
        assert status == 200, answer
        return dict(answer)

    def schedule(self, pod_name: str, namespace: str = "default") -> str | None:
        """Filter then bind, as kube-scheduler would; returns the node or None when nothing fits."""
        answer = self.filter(pod_name, namespace=namespace)
        if not answer["NodeNames"]:
            return None
        node = str(answer["NodeNames"][0])
        result = self.bind(pod_name, node, namespace)
        assert result["Error"] == "", result
        return node

    def flush(self) -> None:
        """Every watch event delivered."""
        self.cluster.flush()


class FakeNodeSide:
    """Stands in for the node daemon's Allocate: marks allocating pods on its nodes as served, frees the lock."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.served: list[str] = []
        self._lock = threading.Lock()
        _, rv = cluster.list("pods")
        self._sub = cluster.watch("pods", rv, self._on_pod)

    def _on_pod(self, event: WatchEvent) -> None:
        m = meta(event.object)
        node = (event.object.get("spec") or {}).get("nodeName")
        if event.type == "DELETED" or not node or (m.get("annotations") or {}).get(BIND_PHASE) != "allocating":
            return
        with self._lock:  # an event may be older than a write of ours already made (the label patch's view)
            current = meta(self.cluster.get("pods", m["name"], m["namespace"]))
            if (current.get("annotations") or {}).get(BIND_PHASE) != "allocating":
                return
            self.cluster.patch_metadata("pods", m["name"], m["namespace"], annotations={BIND_PHASE: "success"})
            NodeLocks(self.cluster).release(node, m["namespace"], m["name"])
            self.served.append(m["name"])

    def stop(self) -> None:
        self._sub.stop()
