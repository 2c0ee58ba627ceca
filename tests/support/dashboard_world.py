"""A known cluster for the dashboard's tests: two nodes of two NVIDIA models, pods sharing devices, a node lock,
a pod waiting for Allocate, a pod kube-scheduler could not place (with its FailedScheduling event), in a
`MemoryCluster` (served over HTTP by `ClusterApiServer` for the browser tests), and the figures they must show;
`node_monitor()` is gpu-node's daemon metrics (the real `hami.node.monitor`) with known usage."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

from scheduler_harness import gpu_node, gpu_pod

from hami.cluster import MemoryCluster
from hami.codec import NodeLock, encode_link_scores, encode_node_lock, encode_pod_devices
from hami.model import ContainerDevice
from hami.node.monitor import NodeMonitor
from hami.testing.apiserver import ApiRequest, ClusterApiServer, Override

LOCK = "hami.io/mutex.lock"


def placed(name: str, node: str, devices: list[list[tuple[str, int, int]]], **extra: Any) -> dict[str, Any]:
    """A pod as the scheduler and node daemon leave it: on `node` with (uuid, MiB, cores) per container."""
    pod = gpu_pod(name, apps=[{"nvidia.com/gpu": str(len(d))} for d in devices], **extra)
    value = encode_pod_devices([tuple(ContainerDevice(uuid=u, type="NVIDIA", usedmem=m, usedcores=c) for u, m, c in d)
                                for d in devices])  # fmt: skip
    pod["metadata"]["annotations"].update(
        {"hami.io/vgpu-devices-allocated": value, "hami.io/vgpu-node": node, "hami.io/bind-phase": "success"}
    )
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return pod


def build(cluster: MemoryCluster | None = None) -> MemoryCluster:
    """The known cluster. Its figures:

    - gpu-node: 4 × NVIDIA-A100 of 40960 MiB; a100-0 shared by `train` (10000 MiB, 30 %) and team-a/`infer`
      (2 containers: 4000 + 2000 MiB, 20 %); a100-1 by `big` (40960 MiB, the whole card); a100-2 and -3 idle.
      NVLink score between a100-0 and a100-1: 200. Locked by `binding` for 42 s.
    - t4-node: 2 × NVIDIA-Tesla-T4 of 15360 MiB; t4-0 used by `binding` (3000 MiB), waiting for Allocate.
    - `too-big` has no node: kube-scheduler's FailedScheduling event says why.
    """
    cluster = cluster or MemoryCluster()
    now = datetime.now(UTC)
    a100 = gpu_node("gpu-node", gpus=4, memory=40960, model="NVIDIA-A100")
    a100["metadata"]["labels"] = {"topology.hami.io/nvlink-island": "0", "kubernetes.io/hostname": "gpu-node"}
    a100["metadata"]["annotations"]["hami.io/node-nvidia-score"] = encode_link_scores(
        {"GPU-gpu-node-0": {"GPU-gpu-node-1": 200}, "GPU-gpu-node-1": {"GPU-gpu-node-0": 200}}
    )
    a100["metadata"]["annotations"][LOCK] = encode_node_lock(
        NodeLock(now - timedelta(seconds=42), "default", "binding", "uid-binding")
    )
    t4 = gpu_node("t4-node", gpus=2, memory=15360, split=4, model="NVIDIA-Tesla-T4")
    for node in (a100, t4):
        node["status"]["allocatable"] = dict(node["status"]["capacity"])
        cluster.create("nodes", node)
    cluster.create("pods", placed("train", "gpu-node", [[("GPU-gpu-node-0", 10000, 30)]]))
    infer = [[("GPU-gpu-node-0", 4000, 20)], [("GPU-gpu-node-0", 2000, 0)]]
    cluster.create("pods", placed("infer", "gpu-node", infer, namespace="team-a"))
    cluster.create("pods", placed("big", "gpu-node", [[("GPU-gpu-node-1", 40960, 0)]]))
    binding = placed("binding", "t4-node", [[("GPU-t4-node-0", 3000, 0)]])
    binding["metadata"]["annotations"].update(
        {"hami.io/bind-phase": "allocating", "hami.io/bind-time": str(int(now.timestamp()) - 30)}
    )
    binding["status"]["phase"] = "Pending"
    cluster.create("pods", binding)
    too_big = gpu_pod("too-big", mem=100000)
    cluster.create("pods", too_big)
    cluster.create(
        "events",
        {
            "metadata": {"name": "too-big.1", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "too-big", "namespace": "default"},
            "reason": "FailedScheduling",
            "message": "0/2 nodes are available: 2 no device with 100000 MiB free.",
            "type": "Warning",
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )
    return cluster


def place_new_pod(cluster: MemoryCluster) -> None:
    """A pod placed after the page was opened: `late` on t4-1 with 5000 MiB."""
    cluster.create("pods", placed("late", "t4-node", [[("GPU-t4-node-1", 5000, 0)]]))


class FlakyApiServer(ClusterApiServer):
    """The in-memory API server, which drops every connection once `down` is set (an API server gone away)."""

    down = False
    hang: threading.Event | None = None
    """When set, every request waits for this event (or 30 s) before it is served: an API server that hangs."""

    def __enter__(self) -> FlakyApiServer:
        self.start()
        return self

    def intercept(self, request: ApiRequest) -> Override | None:
        if self.hang is not None:
            self.hang.wait(30)
        return Override(0) if self.down else None


def node_monitor() -> NodeMonitor:
    """gpu-node's daemon as `hami node` builds it (`hami.node.monitor`), its readers standing in for the driver and
    the accounting files: card 0 has 9000 MiB in use and is busy half the time; train uses 7000 MiB and a quarter of
    the card, infer's two containers 1000 MiB each; card 1 reads nonsense (unknown); big's container has not started."""
    from hami.model import Device, DeviceReading, NodeInventory
    from hami.node.monitor import ContainerUsage
    from hami.node.pods import ServedContainer

    mib = 1024 * 1024
    inventory = {
        "NVIDIA": NodeInventory(
            kind="NVIDIA",
            devices=tuple(Device(id=f"GPU-gpu-node-{i}", index=i, type="NVIDIA-A100", devmem=40960) for i in range(4)),
        )
    }

    def served(ns: str, pod: str, container: str, uuid: str, mem: int, cores: int) -> ServedContainer:
        grant = (ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores),)
        return ServedContainer(ns, pod, f"uid-{pod}", container, 0, "NVIDIA", grant)

    containers = [
        served("default", "train", "c0", "GPU-gpu-node-0", 10000, 30),
        served("team-a", "infer", "c0", "GPU-gpu-node-0", 4000, 20),
        served("team-a", "infer", "c1", "GPU-gpu-node-0", 2000, 0),
        served("default", "big", "c0", "GPU-gpu-node-1", 40960, 0),
    ]
    usage = [
        ContainerUsage("uid-train", "c0", "GPU-gpu-node-0", memory_used_bytes=7000 * mib, utilization_ratio=0.25),
        ContainerUsage("uid-infer", "c0", "GPU-gpu-node-0", memory_used_bytes=1000 * mib),
        ContainerUsage("uid-infer", "c1", "GPU-gpu-node-0", memory_used_bytes=1000 * mib),
    ]
    readings = [
        DeviceReading(device_uuid="GPU-gpu-node-0", memory_used_bytes=9000 * mib, utilization_percent=50,
                      power_watts=251.5, temperature_celsius=61),
        DeviceReading(device_uuid="GPU-gpu-node-1", memory_used_bytes=-1, utilization_percent=400),
    ]  # fmt: skip
    return NodeMonitor(
        "gpu-node",
        lambda: inventory,
        lambda: containers,
        container_usage=lambda: usage,
        device_usage=lambda: readings,
    )


def text(html: bytes) -> str:
    """The page's text, tags removed and whitespace folded, for asserting what a reader sees."""
    folded = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html.decode()))).strip()
    return re.sub(r" ([.,;])", r"\1", folded)


def section(html: bytes, ident: str) -> str:
    """The text of the element with id `ident` (up to its closing tag of the same name)."""
    m = re.search(rf'<(\w+)[^>]*\bid="{ident}"[^>]*>(.*?)</\1>', html.decode(), re.S)
    assert m is not None, f"no element #{ident}"
    return text(m.group(2).encode())


class NodeMetricsServer:
    """Node daemons' /metrics on loopback, one path per node (`/<node>/metrics`, the real `hami.node.monitor`
    text of `node_monitor()` for gpu-node), others 404: `template` is the dashboard's `--node-metrics`."""

    def __init__(self, texts: dict[str, str] | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.texts = texts if texts is not None else {"gpu-node": node_monitor().render().decode()}
        texts_now = self.texts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                node = self.path.strip("/").split("/")[0]
                body = texts_now[node].encode() if node in texts_now else b"no such node\n"
                self.send_response(200 if node in texts_now else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.template = f"http://127.0.0.1:{self.server.server_address[1]}/{{node}}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
