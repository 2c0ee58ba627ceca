"""Scheduler extender throughput and latency, driven over HTTP exactly as kube-scheduler drives it.

    python benchmarks/scheduler.py --nodes 1000 --devices-per-node 8 --pods 8000 --json

Builds an in-memory cluster of NODES nodes (NVIDIA register annotations, DEVICES GPUs each) already holding
PODS running pods (1 GPU, 1000 MiB, 10 % cores each, spread over the nodes), starts the real scheduler
service and HTTP extender on loopback, and schedules --measure new pods one after another: a filter with
every node name (nodeCacheCapable) then a bind to the chosen node. A stand-in for the node daemon marks each
bound pod allocated and releases the node lock, as the real daemon's Allocate does. Prints percentiles, and
last one JSON object: nodes, filter_p50_ms, filter_p99_ms, bind_p99_ms, pods_per_s, ... The client is a process of
its own, as kube-scheduler is (`--client thread` drives from inside the scheduler's process instead, still over
HTTP; `--client direct` calls the extender's filter and bind in process, timing the decision without HTTP, and
adds filter_cpu_p50_ms / filter_cpu_p99_ms: the filters' thread CPU time, which other processes on a busy machine
do not inflate).

`--workload varied` makes the fragmentation-aware and best-fit policies work for their answer: nodes publish
allocatable CPU and memory, running pods request CPU and memory of several sizes (so nodes differ in what is
left), and the measured pods cycle through shared, whole and two-device requests, some with a type selector.

    python benchmarks/scheduler.py --policy fragmentation-aware --workload varied --json
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import time
from typing import Any

from hami.cluster import MemoryCluster, WatchEvent, meta
from hami.cluster.locks import NodeLocks
from hami.codec import encode_node_register, encode_pod_devices
from hami.model import ContainerDevice, Device
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE, Extender, ExtenderSettings
from hami.scheduler.server import ExtenderApp, ExtenderServer
from hami.scheduler.service import SchedulerService

VARIED_SHAPES = (
    # (GPUs, MiB per GPU, cores %, CPU millicores, memory MiB, type selector)
    ("1", "1000", "10", 2000, 8192, ""),
    ("1", "20000", "30", 4000, 16384, ""),
    ("1", "40960", "50", 8000, 32768, "H100"),
    ("1", "81920", "100", 12000, 65536, ""),
    ("2", "81920", "100", 24000, 131072, ""),
    ("1", "8000", "20", 1000, 4096, "A100"),
)


def node(name: str, devices: int, *, varied: bool = False) -> dict[str, Any]:
    model = "NVIDIA-A100" if varied and name.endswith(("3", "7")) else "NVIDIA-H100"
    gpus = [
        Device(id=f"GPU-{name}-{i}", index=i, count=10, devmem=81920, devcore=100, type=model, numa=i // 4)
        for i in range(devices)
    ]
    obj: dict[str, Any] = {
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_register(gpus)}}
    }
    if varied:
        obj["status"] = {"allocatable": {"cpu": "128", "memory": "1Ti"}}
    return obj


def pod(
    name: str, *, node_name: str | None = None, device: str | None = None, shape: int | None = None
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    requests: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if shape is not None:
        count, mem, cores, cpu, memory, selector = VARIED_SHAPES[shape % len(VARIED_SHAPES)]
        limits = {"nvidia.com/gpu": count, "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}
        requests = {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}
        if selector and node_name is None:
            annotations["nvidia.com/use-gputype"] = selector
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "bench", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits, "requests": requests}}]},
        "status": {"phase": "Pending"},
    }
    if node_name and device:
        usedmem, usedcores = int(limits["nvidia.com/gpumem"]), int(limits["nvidia.com/gpucores"])
        value = encode_pod_devices(
            [(ContainerDevice(uuid=device, type="NVIDIA", usedmem=usedmem, usedcores=usedcores),)]
        )
        obj["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": value, BIND_PHASE: "success"}
        obj["spec"]["nodeName"] = node_name
        obj["status"]["phase"] = "Running"
    return obj


class NodeSideStandIn:
    """Marks bound pods allocated and releases their node lock, as the node daemon's Allocate does."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.locks = NodeLocks(cluster)
        self.sub = cluster.watch("pods", cluster.resource_version(), self.on_pod)

    def on_pod(self, event: WatchEvent) -> None:
        m = meta(event.object)
        target = (event.object.get("spec") or {}).get("nodeName")
        if event.type != "DELETED" and target and (m.get("annotations") or {}).get(BIND_PHASE) == "allocating":
            self.cluster.patch_metadata("pods", m["name"], m["namespace"], annotations={BIND_PHASE: "success"})
            self.locks.release(target, m["namespace"], m["name"])


def running_cluster(nodes: int, devices: int, pods: int) -> tuple[MemoryCluster, list[str]]:
    """A cluster of `nodes` uniform nodes holding `pods` running pods spread over them, and the nodes' names."""
    cluster = MemoryCluster()
    names = [f"node-{i:05d}" for i in range(nodes)]
    for name in names:
        cluster.create("nodes", node(name, devices))
    for i in range(pods):
        n = i % nodes
        device = f"GPU-{names[n]}-{(i // nodes) % devices}"
        cluster.create("pods", pod(f"running-{i}", node_name=names[n], device=device))
    return cluster, names


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def drive(port: int, names: list[str], pods: list[dict[str, Any]], queue: Any) -> None:
    """Filter then bind each pod over one keep-alive connection; puts (filter seconds, bind seconds,
    unschedulable, elapsed seconds, failure) on `queue`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(verb: str, body: dict[str, Any]) -> dict[str, Any]:
        conn.request("POST", f"/{verb}", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        answer: dict[str, Any] = json.loads(conn.getresponse().read())
        return answer

    filters: list[float] = []
    binds: list[float] = []
    unschedulable = 0
    failure = ""
    started = time.perf_counter()
    for obj in pods:
        t0 = time.perf_counter()
        answer = post("filter", {"Pod": obj, "NodeNames": names})
        t1 = time.perf_counter()
        filters.append(t1 - t0)
        if not answer["NodeNames"]:
            unschedulable += 1
            continue
        bound = post(
            "bind",
            {
                "PodName": meta(obj)["name"],
                "PodNamespace": "bench",
                "PodUID": meta(obj)["uid"],
                "Node": answer["NodeNames"][0],
            },
        )
        binds.append(time.perf_counter() - t1)
        if bound["Error"]:
            failure = f"bind failed: {bound['Error']}"
            break
    queue.put((filters, binds, unschedulable, time.perf_counter() - started, failure))


def drive_direct(extender: Extender, names: list[str], pods: list[dict[str, Any]], queue: Any) -> None:
    """As `drive`, calling the extender in process (no HTTP, no JSON): the decision's own time. Also puts the
    filters' thread CPU seconds (what a busy machine's other processes do not inflate) last on `queue`."""
    filters: list[float] = []
    cpu: list[float] = []
    binds: list[float] = []
    unschedulable = 0
    failure = ""
    started = time.perf_counter()
    for obj in pods:
        c0 = time.thread_time()
        t0 = time.perf_counter()
        result = extender.filter(obj, names)
        t1 = time.perf_counter()
        cpu.append(time.thread_time() - c0)
        filters.append(t1 - t0)
        if not result.node:
            unschedulable += 1
            continue
        bound = extender.bind("bench", meta(obj)["name"], meta(obj)["uid"], result.node)
        binds.append(time.perf_counter() - t1)
        if bound.error:
            failure = f"bind failed: {bound.error}"
            break
    queue.put((filters, binds, unschedulable, time.perf_counter() - started, failure, cpu))


def cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster's size, the pods measured and the policy (shared with benchmarks/scheduler_api.py)."""
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=8000, help="running pods already placed")
    parser.add_argument("--measure", type=int, default=1000, help="new pods scheduled and timed")
    parser.add_argument("--policy", choices=["binpack", "spread", "best-fit", "fragmentation-aware"], default="binpack")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cluster_arguments(parser)
    parser.add_argument("--workload", choices=["uniform", "varied"], default="uniform")
    parser.add_argument(
        "--client",
        choices=["process", "thread", "direct"],
        default="process",
        help="drive the extender from a process of its own, as kube-scheduler does (default), or from a thread of "
        "the scheduler's process (sharing its interpreter lock, as this script did before the front moved to uvicorn), "
        "or call the extender in process without HTTP (direct: the decision's own time)",
    )
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    varied = args.workload == "varied"

    cluster = MemoryCluster()
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    for name in names:
        cluster.create("nodes", node(name, args.devices_per_node, varied=varied))
    for i in range(args.pods):
        n = i % args.nodes
        device = f"GPU-{names[n]}-{(i // args.nodes) % args.devices_per_node}"
        shape = (i * 7 // args.nodes) % 2 if varied else None  # running pods: the two smallest shapes, mixed
        cluster.create("pods", pod(f"running-{i}", node_name=names[n], device=device, shape=shape))

    built = time.perf_counter()
    # as `hami scheduler` decides: the placement written by the bind, nodes with decisions in flight passed over
    settings = ExtenderSettings(node_policy=args.policy, record_at_bind=True, pass_over_nodes_in_flight=True)
    service = SchedulerService(cluster, VendorPlugins.load(), settings).start()
    sync_s = time.perf_counter() - built
    server = ExtenderServer(ExtenderApp(service.extender, ready=lambda: service.ready), ("127.0.0.1", 0)).start()
    stand_in = NodeSideStandIn(cluster)
    # The measured pods exist before the clock starts (the client may be another process, which cannot create
    # them); each is filtered against every node and bound to the node chosen.
    pods = [cluster.create("pods", pod(f"new-{i}", shape=i if varied else None)) for i in range(args.measure)]
    time.sleep(0.5)  # the watch delivers the new pending pods before the clock starts
    context = multiprocessing.get_context("fork")
    queue: Any = context.Queue()
    drive_args = (server.port, names, pods, queue)
    cpu: list[float] = []  # thread CPU seconds per filter, where the client runs in process
    if args.client == "process":
        child = context.Process(target=drive, args=drive_args)
        child.start()
        filters, binds, unschedulable, elapsed, failure = queue.get(timeout=3600)
        child.join()
    elif args.client == "direct":
        drive_direct(service.extender, names, pods, queue)
        filters, binds, unschedulable, elapsed, failure, cpu = queue.get()
    else:
        drive(*drive_args)
        filters, binds, unschedulable, elapsed, failure = queue.get()
    if failure:
        raise SystemExit(failure)
    stand_in.sub.stop()
    server.stop()
    service.stop()

    result = {
        "nodes": args.nodes,
        "devices_per_node": args.devices_per_node,
        "running_pods": args.pods,
        "measured_pods": args.measure,
        "policy": args.policy,
        "workload": args.workload,
        "state_sync_s": round(sync_s, 3),
        "filter_p50_ms": round(1000 * percentile(filters, 0.50), 3),
        "filter_p99_ms": round(1000 * percentile(filters, 0.99), 3),
        "filter_mean_ms": round(1000 * statistics.fmean(filters), 3),
        "bind_p50_ms": round(1000 * percentile(binds, 0.50), 3) if binds else None,
        "bind_p99_ms": round(1000 * percentile(binds, 0.99), 3) if binds else None,
        "pods_per_s": round(args.measure / elapsed, 1),
        "unschedulable": unschedulable,
        "client": args.client,
    }
    if cpu:
        result["filter_cpu_p50_ms"] = round(1000 * percentile(cpu, 0.50), 3)
        result["filter_cpu_p99_ms"] = round(1000 * percentile(cpu, 0.99), 3)
    if not args.json:
        for key, value in result.items():
            print(f"{key:<18} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
