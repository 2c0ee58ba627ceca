"""The scheduler extender against a real control plane: `hami scheduler` as the chart runs it, driven as kube-scheduler
drives it.

    python benchmarks/scheduler_api.py                       # 1,000 nodes x 8 GPUs, 8,000 running pods
    python benchmarks/scheduler_api.py --nodes 100 --pods 800 --measure 200 --policy spread

Starts etcd and kube-apiserver from the end-to-end suite's binaries (tests/e2e/build_control_plane.sh), applies the
chart, builds NODES nodes (NVIDIA register annotations, DEVICES GPUs each, allocatable CPU, memory and GPUs) and PODS
running pods (1 GPU, 1000 MiB, 10 % cores each, bound and allocated, spread over the nodes) through the API, then
starts `hami scheduler` with the chart's hami.yaml as the chart's scheduler ServiceAccount, and times until it
answers ready. Then --measure new pods are created and scheduled as kube-scheduler schedules them: one filter at a
time (the pod as the API serves it, every node name: the chart's extender is nodeCacheCapable), each bind handed to
a pool of --binders threads (kube-scheduler binds asynchronously) unless --serial. A stand-in for the node daemons
(a process of its own, through the project's own `KubeCluster` and `NodeLocks`) makes the API requests the daemon's
Allocate makes for each bound pod: with `--node-lock lease` (the default: the nodes' daemons are this project's and
offer their lock as a Lease), the Lease read, the pod read and one patch of the pod; with `--node-lock annotation`
(HAMi's daemons), the Node read for its lock, the pod read and patched, and the lock released on the Node.

Prints p50/p99 of filter and bind, pods/s (measured pods over the time until the last bind answered), the seconds
from starting the scheduler until ready, and the resident memory (now and peak) of the scheduler and of
kube-apiserver and etcd (`control_plane_rss_mib`: [now, peak] each); the last line is one JSON object. Progress
goes to stderr. The machine is shared with the API server: measure on a quiet one.

Where the time goes: the CPU seconds each process spent while the pods were scheduled (kube-apiserver, etcd, the
scheduler, this driver, the node-side stand-in in a process of its own), per measured pod; and what the control
plane did in that window per measured pod, by its own metrics read before and after: the API requests by verb and
resource (`apiserver_request_total`) and their body bytes, the watch events fanned out to watchers and their bytes
by resource (`apiserver_watch_events_total`, `_sizes`), the API server's etcd requests by operation and resource, and
etcd's puts, bytes put and bytes written to its WAL (etcd's /metrics).
On two cores the pods/s is bounded by their sum: 2 / (CPU seconds per pod).

    python benchmarks/scheduler_api.py --set scheduler.dashboardListen=   # a chart value changed: no dashboard
    python benchmarks/scheduler_api.py --starts 5    # the time until ready five times (restarts), the last measured
    python benchmarks/scheduler_api.py --node-metrics 9394   # every node's daemon answers the hosted dashboard's scrape

With --node-metrics each node has a loopback InternalIP of its own and a process (at the lowest priority: the daemons
run on their own nodes) answers every node's /metrics as this project's daemon does for its GPUs and pods, so the
hosted dashboard's collector does its whole work; without it no node has an address and nothing is fetched. The
CPU and memory of the scheduler's own child processes (the dashboard's collector) are reported beside its own.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from control_plane import ControlPlane, find_binaries, wait_until  # noqa: E402
from hami_stack import NAMESPACE as STACK_NAMESPACE  # noqa: E402
from hami_stack import RELEASE, HamiStack  # noqa: E402
from kube_rest import ApiError, KubeApi  # noqa: E402

from hami.cluster import WatchEvent, meta  # noqa: E402
from hami.cluster.kube import KubeCluster  # noqa: E402
from hami.cluster.locks import NodeLocks  # noqa: E402
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, holder_of  # noqa: E402
from hami.cluster.port import ConflictError  # noqa: E402
from hami.codec import Handshake, encode_handshake, encode_node_register, encode_pod_devices  # noqa: E402
from hami.model import ContainerDevice, Device  # noqa: E402
from hami.scheduler.extender import BIND_PHASE  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from scheduler import cluster_arguments, percentile  # noqa: E402

NAMESPACE = "bench"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def node_object(name: str, devices: int, lease: bool = True, address: str | None = None) -> dict[str, Any]:
    gpus = [
        Device(id=f"GPU-{name}-{i}", index=i, count=10, devmem=81920, devcore=100, type="NVIDIA-H100", numa=i // 4)
        for i in range(devices)
    ]
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "250", "nvidia.com/gpu": str(10 * devices)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "gpu": "on"},
            # the register annotation and the handshake's answer, as this project's node daemon writes them (without
            # the answer, the scheduler's first handshake round asks every node: 1,000 writes within the run)
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_register(gpus),
                "hami.io/node-handshake": encode_handshake(Handshake("Reported", datetime.now())),
                # the daemon's offer of its node lock Lease (created by `lease_object`), as it writes it
                **({LEASE_ANNOTATION: f"{STACK_NAMESPACE}/{LEASE_PREFIX}{name}"} if lease else {}),
            },
        },
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            **({"addresses": [{"type": "InternalIP", "address": address}]} if address else {}),
        },
    }


def node_address(n: int) -> str:
    """Node n's InternalIP with --node-metrics: a loopback address of its own (all of 127/8 reaches lo)."""
    return f"127.{1 + n // 65536}.{n // 256 % 256}.{n % 256}"


def serve_node_metrics(port: int, devices: int, pods_per_node: int, started: Any) -> None:
    """Every node daemon's /metrics (--node-metrics), in a process of its own: on `port` of every loopback address,
    what this project's node daemon answers for a node of `devices` GPUs and `pods_per_node` running pods (the real
    `hami.node.monitor`, rendered once by benchmarks/dashboard.py's `metrics_text` and renamed for the node that
    the request's address names)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dashboard import metrics_text

    os.nice(19)  # the daemons run on their own nodes: here they take the CPU only when nothing measured wants it
    template = "node-TEMPLATE"
    text = metrics_text(
        template, devices, [(f"running-{i}", f"GPU-{template}-{i % devices}") for i in range(pods_per_node)]
    )

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            _, a, b, c = (int(x) for x in self.headers.get("Host", "").split(":")[0].split("."))
            body = text.replace(template, f"node-{(a - 1) * 65536 + b * 256 + c:05d}").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    started.set()
    server.serve_forever()


def lease_object(node: str) -> dict[str, Any]:
    """The node lock's Lease as this project's daemon creates it (`hami.cluster.nodelease.DaemonLease`)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE_PREFIX + node, "namespace": STACK_NAMESPACE},
        "spec": {},
    }


def pod_object(name: str, node: str | None = None, device: str | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }
    if node and device:
        value = encode_pod_devices([(ContainerDevice(uuid=device, type="NVIDIA", usedmem=1000, usedcores=10),)])
        obj["metadata"]["annotations"] = {
            "hami.io/vgpu-devices-allocated": value,
            "hami.io/vgpu-node": node,
            BIND_PHASE: "success",
        }
        obj["spec"]["nodeName"] = node
    return obj


def create_all(api: KubeApi, objects: list[dict[str, Any]], threads: int, what: str) -> float:
    started = time.perf_counter()

    def create(obj: dict[str, Any]) -> None:
        try:
            api.create(obj)
        except ApiError as exc:
            if exc.status != 409:
                raise

    with ThreadPoolExecutor(threads) as pool:
        for done, _ in enumerate(pool.map(create, objects), 1):
            if done % 2000 == 0:
                log(f"  {what}: {done}/{len(objects)}")
    return time.perf_counter() - started


class NodeSideStandIn:
    """Makes the requests the node daemon's Allocate makes for each bound pod (`hami.node.allocate`), in order: the
    lock's holder (the node's Lease, or the Node's annotation lock), the pod (with a Lease, both as the API server's
    watch cache has them, read again from etcd when behind, as the daemon reads them), one patch of the pod emptying its
    to-allocate entry with `bind-phase: success` (on its resourceVersion), and, for an annotation lock, its release
    (the Node read and patched)."""

    def __init__(self, cluster: KubeCluster, lease: bool) -> None:
        self.cluster = cluster
        self.lease = lease
        self.locks = NodeLocks(cluster)
        self.done: set[str] = set()
        # Each node has a daemon of its own: allocations on different nodes go on at once, so this pool must not be
        # what bounds the pods/s (with 4 threads it was, at about 35 pods/s).
        self.pool = ThreadPoolExecutor(32, thread_name_prefix="stand-in")
        _, version = cluster.list("pods", NAMESPACE)
        self.sub = cluster.watch("pods", version, self.on_pod)

    def on_pod(self, event: WatchEvent) -> None:
        m = meta(event.object)
        target = (event.object.get("spec") or {}).get("nodeName")
        if event.type == "DELETED" or not target or (m.get("annotations") or {}).get(BIND_PHASE) != "allocating":
            return
        if m["name"] in self.done:
            return
        self.done.add(m["name"])
        self.pool.submit(self.allocate, m["name"], m["namespace"], target)

    def allocate(self, name: str, namespace: str, node: str) -> None:
        if self.lease:  # as the API server's watch cache has it, then from etcd if that is behind (as the daemon)
            holder = holder_of(self.cluster.get("leases", LEASE_PREFIX + node, STACK_NAMESPACE, recent=True))
            if holder is None or (holder.namespace, holder.name) != (namespace, name):
                holder = holder_of(self.cluster.get("leases", LEASE_PREFIX + node, STACK_NAMESPACE))
        else:
            holder = self.locks.holder(meta(self.cluster.get("nodes", node)).get("annotations") or {})
        if holder is None or (holder.namespace, holder.name) != (namespace, name):
            log(f"stand-in: {namespace}/{name} on {node} does not hold the node's lock ({holder})")
        served = {"hami.io/vgpu-devices-to-allocate": encode_pod_devices([()]), BIND_PHASE: "success"}
        for recent in (self.lease, False):  # HAMi's daemons read the pod from etcd
            pod = meta(self.cluster.get("pods", name, namespace, recent=recent))
            try:
                self.cluster.patch_metadata(
                    "pods", name, namespace, annotations=served, resource_version=pod["resourceVersion"]
                )
                break
            except ConflictError:
                if not recent:
                    raise
        if not self.lease:
            self.locks.release(node, namespace, name)

    def stop(self) -> None:
        self.sub.stop()
        self.pool.shutdown()


def node_side(kubeconfig: str, lease: bool, started: Any, stop: Any) -> None:
    """The stand-in in a process of its own, as the node daemons are: its watch and API calls then take no
    interpreter lock from the client whose filter times are measured (kube-scheduler has none to share)."""
    stand_in = NodeSideStandIn(KubeCluster.from_kubeconfig(kubeconfig), lease)
    started.set()
    stop.wait()
    stand_in.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A Prometheus text exposition read as {(metric name, sorted labels): value}."""


def scrape(text: str) -> Samples:
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels_text = head.partition("{")
        labels = []
        for part in labels_text.rstrip("}").split('",'):
            key, sep, raw = part.partition("=")
            if sep:
                labels.append((key.strip(","), raw.strip('"')))
        try:
            samples[(name, tuple(sorted(labels)))] = float(value)
        except ValueError:
            continue
    return samples


def by(samples: Samples, name: str, keys: tuple[str, ...]) -> dict[str, float]:
    """`name` summed by the values of `keys` (joined with "/", empty values left out)."""
    sums: dict[str, float] = {}
    for (metric, labels), value in samples.items():
        if metric == name:
            found = dict(labels)
            what = " ".join("/".join(v for v in (found.get(k, "") for k in group.split("/")) if v) for group in keys)
            sums[what] = sums.get(what, 0.0) + value
    return sums


def control_plane_counters(api: KubeApi, etcd_url: str) -> dict[str, dict[str, float]]:
    """What the API server and etcd have done so far, by their own metrics: requests served by "VERB
    resource[/subresource]" (`apiserver_request_total`) and the request bytes they carried
    (`apiserver_request_body_size_bytes`), the watch events sent to watchers by resource and their bytes
    (`apiserver_watch_events_total`, `apiserver_watch_events_sizes`), the API server's requests to etcd by
    operation and resource (`etcd_requests_total`), and etcd's own puts, bytes put and bytes written to its WAL."""
    server = scrape(api.text("/metrics"))
    with urllib.request.urlopen(f"{etcd_url}/metrics", timeout=10) as response:
        etcd = scrape(response.read().decode())
    own = {
        "puts": "etcd_mvcc_put_total",
        "put_bytes": "etcd_debugging_mvcc_total_put_size_in_bytes",
        "wal_bytes": "etcd_disk_wal_write_bytes_total",
    }
    return {
        "api_requests": by(server, "apiserver_request_total", ("verb", "resource/subresource")),
        "api_request_body_bytes": by(server, "apiserver_request_body_size_bytes_sum", ("verb", "resource")),
        "watch_events": by(server, "apiserver_watch_events_total", ("resource",)),
        "watch_event_bytes": by(server, "apiserver_watch_events_sizes_sum", ("resource",)),
        "etcd_requests": by(server, "etcd_requests_total", ("operation", "resource/type")),
        "etcd": {key: sum(by(etcd, name, ()).values()) for key, name in own.items()},
    }


def per_pod(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], pods: int
) -> dict[str, dict[str, float]]:
    """The counters' growth between two readings, per pod, each group's figures under 0.05 left out."""
    result = {}
    for group, values in after.items():
        grown = {k: (v - before[group].get(k, 0.0)) / pods for k, v in sorted(values.items())}
        result[group] = {k: round(v, 2) for k, v in grown.items() if v >= 0.05}
    return result


def filters_within(port: int, seconds: str = "0.01") -> tuple[float, float]:
    """(filters answered within `seconds`, all filters) by the scheduler's own clock (`hami_scheduler_filter_seconds`,
    from the request's arrival to its answer): what the client's figures add is transport and waiting for a CPU."""
    # a scrape at 5,000 nodes and 40,000 pods is about 55 MB and seconds of CPU: more on a busy machine
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        text = response.read().decode()
    within = total = 0.0
    for line in text.splitlines():
        if line.startswith(f'hami_scheduler_filter_seconds_bucket{{le="{seconds}"}}'):
            within = float(line.split()[-1])
        elif line.startswith("hami_scheduler_filter_seconds_count"):
            total = float(line.split()[-1])
    return within, total


def set_value(settings: dict[str, Any], assignment: str) -> None:
    """`section.key=value` (the value read as YAML; empty: the key removed) into the loaded hami.yaml."""
    path, _, raw = assignment.partition("=")
    *parents, key = path.split(".")
    target = settings
    for part in parents:
        target = target.setdefault(part, {})
    if raw == "":
        target.pop(key, None)
    else:
        target[key] = yaml.safe_load(raw)


def children_of(pid: int) -> list[int]:
    """The processes `pid` started (the hosted dashboard's usage collector runs in one)."""
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def rss_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def ms(values: list[float], q: float) -> float | None:
    return round(1000 * percentile(values, q), 2) if values else None


SCHEDULER_ACCOUNT = (STACK_NAMESPACE, f"{RELEASE}-scheduler")
"""The chart's scheduler ServiceAccount (namespace, name)."""


def in_cluster(
    argv: list[str], env: dict[str, str], plane: ControlPlane, settings: dict[str, Any], config: Path, folder: Path
) -> list[str]:
    """Run the scheduler as a pod of the chart is run: its ServiceAccount's token (a TokenRequest, as the kubelet
    asks for one) and the cluster's CA in /var/run/secrets/kubernetes.io/serviceaccount (a private mount namespace:
    nothing on the machine changes), the API server's address in KUBERNETES_SERVICE_HOST/PORT, and no kubeconfig."""
    namespace, name = SCHEDULER_ACCOUNT
    assert plane.admin is not None
    answer = plane.admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    folder.mkdir(exist_ok=True)
    (folder / "token").write_text(answer["status"]["token"])
    (folder / "ca.crt").write_bytes(Path(plane.pki.ca).read_bytes())
    settings.pop("kubeconfig", None)
    config.write_text(yaml.safe_dump(settings))
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
    mount = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && "
        f'cp {folder}/token {folder}/ca.crt /run/secrets/kubernetes.io/serviceaccount/ && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", *argv]


def start_scheduler(
    argv: list[str], env: dict[str, str], log_path: Path, port: int
) -> tuple[subprocess.Popen[bytes], float]:
    """Start `hami scheduler` and wait until /readyz answers 200: the process and the seconds that took."""
    started = time.perf_counter()
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"hami scheduler exited: {log_path.read_text()[-3000:]}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)

    wait_until(ready, 300, "hami scheduler ready")
    return process, time.perf_counter() - started


def attach(template: str, pid: int) -> subprocess.Popen[bytes]:
    """`template` with {pid} started against the scheduler (a profiler), once it has had a moment to attach."""
    profiler = subprocess.Popen(template.format(pid=pid).split())
    time.sleep(1.0)
    if profiler.poll() is not None:
        raise RuntimeError(f"--attach {template!r} exited at once ({profiler.returncode})")
    return profiler


class Extender:
    """kube-scheduler's side of the extender protocol: one keep-alive connection per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()

    def post(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", f"/{verb}", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        answer: dict[str, Any] = json.loads(conn.getresponse().read())
        return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cluster_arguments(parser)
    parser.add_argument("--binders", type=int, default=16, help="concurrent binds (kube-scheduler binds in parallel)")
    parser.add_argument("--serial", action="store_true", help="bind each pod before filtering the next")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="pods arriving per second (filter i starts no earlier than i/RATE s in), for the latency at a load "
        "below saturation; 0: each filter as soon as the last answered",
    )
    parser.add_argument("--create-threads", type=int, default=8)
    parser.add_argument(
        "--node-lock",
        choices=["lease", "annotation"],
        default="lease",
        help="the nodes' daemons as this project's, offering the node lock as a Lease (default), or as HAMi's, "
        "locked by the hami.io/mutex.lock annotation on the Node",
    )
    parser.add_argument(
        "--connect",
        choices=["in-cluster", "kubeconfig"],
        default="in-cluster",
        help="how the scheduler reaches the API server: as the chart's pod does, with its ServiceAccount's token "
        "in /var/run/secrets (default; a private mount namespace, so root), or with a kubeconfig",
    )
    parser.add_argument(
        "--starts",
        type=int,
        default=1,
        help="start the scheduler this many times (each stopped by SIGTERM but the last, which is measured) and "
        "report each time until ready: one start is one sample of a figure that moves with the machine",
    )
    parser.add_argument(
        "--node-metrics",
        type=int,
        default=0,
        metavar="PORT",
        help="give each node an InternalIP of its own on loopback and answer every node daemon's /metrics there on "
        "PORT (the chart's: 9394), as this project's daemon would for its GPUs and pods, from a process of its own: "
        "the hosted dashboard's scraping measured against answering daemons (default: no address, nothing answers)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) and print where it is")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="change the chart's hami.yaml (repeatable)"
    )
    parser.add_argument(
        "--wrap", default="", help="a command prefix for the scheduler, e.g. 'py-spy record -r 200 -o s.txt -f raw --'"
    )
    parser.add_argument(
        "--attach",
        default="",
        help="a profiler attached to the scheduler for the measured window only (started just before the first "
        "filter, sent SIGINT after the last bind answered), {pid} its process id: e.g. 'py-spy record -r 200 --gil "
        "-o s.txt -f raw --pid {pid}' or 'perf record -g -o perf.data -p {pid}'; start-up and sync left out",
    )
    args = parser.parse_args()

    binaries = find_binaries()
    work = Path(tempfile.mkdtemp(prefix="hami-bench-api-"))
    plane = ControlPlane(binaries, work / "cluster").start()
    scheduler: subprocess.Popen[bytes] | None = None
    stand_in: multiprocessing.process.BaseProcess | None = None
    stop_node_side = multiprocessing.get_context("spawn").Event()
    try:
        stack = HamiStack(plane, binaries, work / "hami")
        stack.apply_chart()
        api = plane.admin
        assert api is not None
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        names = [f"node-{i:05d}" for i in range(args.nodes)]
        log(f"creating {args.nodes} nodes and {args.pods} running pods")
        lease = args.node_lock == "lease"
        addresses = [node_address(i) if args.node_metrics else None for i in range(args.nodes)]
        nodes = [node_object(n, args.devices_per_node, lease, a) for n, a in zip(names, addresses, strict=True)]
        if args.node_metrics:
            metrics_started = multiprocessing.get_context("spawn").Event()
            metrics_server = multiprocessing.get_context("spawn").Process(
                target=serve_node_metrics,
                args=(args.node_metrics, args.devices_per_node, args.pods // args.nodes, metrics_started),
                daemon=True,
            )
            metrics_server.start()
            if not metrics_started.wait(60):
                raise RuntimeError("the node daemons' /metrics did not start")
        node_s = create_all(api, nodes, args.create_threads, "nodes")
        if lease:
            node_s += create_all(api, [lease_object(n) for n in names], args.create_threads, "leases")
        running = []
        for i in range(args.pods):
            n = i % args.nodes
            device = f"GPU-{names[n]}-{(i // args.nodes) % args.devices_per_node}"
            running.append(pod_object(f"running-{i}", names[n], device))
        pod_s = create_all(api, running, args.create_threads, "pods")
        log(f"  built in {node_s:.1f} s (nodes) + {pod_s:.1f} s (pods)")

        if not (stack.dir / "webhook-tls" / "tls.crt").exists():
            stack._make_webhook_certs()
        config = stack._write_scheduler_config()
        settings = yaml.safe_load(config.read_text())
        settings["scheduler"]["nodePolicy"] = args.policy
        for assignment in args.set:
            set_value(settings, assignment)
        config.write_text(yaml.safe_dump(settings))
        argv = [*args.wrap.split(), sys.executable, "-m", "hami.cli", "--log-level", "info", "scheduler"]
        argv += ["--config", str(config)]
        env = dict(os.environ, HAMI_DISABLED_VENDORS=stack.disabled_vendors())
        if args.connect == "in-cluster":
            argv = in_cluster(argv, env, plane, settings, config, work / "serviceaccount")
        ready_runs: list[float] = []
        for start in range(args.starts):
            scheduler, ready_s = start_scheduler(argv, env, work / "hami-scheduler.log", stack.extender_port)
            ready_runs.append(ready_s)
            log(f"scheduler ready after {ready_s:.2f} s")
            for line in (work / "hami-scheduler.log").read_text(errors="replace").splitlines():
                if "scheduler state synced" in line:
                    log(f"  {line.strip()}")  # where the time until ready went, as the scheduler logs it
            if start < args.starts - 1:  # a start only timed: stopped as a rollout stops it, the next one measured
                scheduler.send_signal(signal.SIGTERM)
                scheduler.wait(60)
        spawn = multiprocessing.get_context("spawn")
        node_side_started = spawn.Event()
        kubeconfig = str(plane.identity("admin", "hami-e2e-admin").kubeconfig)
        stand_in = spawn.Process(
            target=node_side, args=(kubeconfig, lease, node_side_started, stop_node_side), daemon=True
        )
        stand_in.start()
        if not node_side_started.wait(60):
            raise RuntimeError("the node-side stand-in did not start")
        extender = Extender(stack.extender_port)
        fresh = [api.create(pod_object(f"new-{i}")) for i in range(args.measure)]
        time.sleep(1.0)  # let the scheduler's watch deliver the new pods, as kube-scheduler's queue would

        filters: list[float] = []
        binds: list[float] = []
        errors: list[str] = []
        unschedulable = 0

        def bind(obj: dict[str, Any], node: str) -> None:
            t0 = time.perf_counter()
            body = {"PodName": meta(obj)["name"], "PodNamespace": NAMESPACE, "PodUID": meta(obj)["uid"], "Node": node}
            answer = extender.post("bind", body)
            binds.append(time.perf_counter() - t0)
            if answer["Error"]:
                errors.append(answer["Error"])

        pending: list[Future[None]] = []
        log(f"scheduling {args.measure} pods ({args.policy}, {'serial' if args.serial else f'{args.binders} binders'})")
        processes = {p.name: p.popen.pid for p in plane.processes}
        processes.update({"scheduler": scheduler.pid, "driver": os.getpid(), "node-side": stand_in.pid or 0})
        processes.update({f"scheduler-child-{n}": pid for n, pid in enumerate(children_of(scheduler.pid))})
        if args.node_metrics:
            processes["node-metrics"] = metrics_server.pid or 0
        # the metrics read first: rendering them costs the API server, etcd and the scheduler (tens of MB at 5,000
        # nodes), which is the measurement's cost, not the pods'
        counters_before = control_plane_counters(api, plane.etcd_url)
        served_before = filters_within(stack.metrics_port)
        profiler = attach(args.attach, scheduler.pid) if args.attach else None
        cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        with ThreadPoolExecutor(args.binders) as binders:
            t_start = time.perf_counter()
            for i, obj in enumerate(fresh):
                if args.rate > 0 and (wait := t_start + i / args.rate - time.perf_counter()) > 0:
                    time.sleep(wait)
                t0 = time.perf_counter()
                answer = extender.post("filter", {"Pod": obj, "NodeNames": names})
                filters.append(time.perf_counter() - t0)
                if not answer["NodeNames"]:
                    unschedulable += 1
                    continue
                if args.serial:
                    bind(obj, answer["NodeNames"][0])
                else:
                    pending.append(binders.submit(bind, obj, answer["NodeNames"][0]))
            for f in pending:
                f.result()
            elapsed = time.perf_counter() - t_start
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy and perf write their report on SIGINT
            profiler.wait(60)
        counters_after = control_plane_counters(api, plane.etcd_url)
        served_after = filters_within(stack.metrics_port)
        served_total = served_after[1] - served_before[1]
        grown = per_pod(counters_before, counters_after, args.measure)
        memory = rss_kib(scheduler.pid)
        plane_memory = {p.name: rss_kib(p.popen.pid) for p in plane.processes}
        result = {
            "nodes": args.nodes,
            "devices_per_node": args.devices_per_node,
            "running_pods": args.pods,
            "measured_pods": args.measure,
            "policy": args.policy,
            "binds": "serial" if args.serial else args.binders,
            "arrival_rate": args.rate or None,
            "connect": args.connect,
            "node_lock": args.node_lock,
            "ready_s": round(ready_s, 2),
            "ready_s_all": [round(r, 2) for r in ready_runs] if len(ready_runs) > 1 else None,
            "filter_p50_ms": ms(filters, 0.5),
            "filter_p99_ms": ms(filters, 0.99),
            "filter_mean_ms": round(1000 * statistics.fmean(filters), 2),
            "filters_within_10ms": round(sum(1 for f in filters if f <= 0.01) / len(filters), 4),
            "filters_within_10ms_by_scheduler": round((served_after[0] - served_before[0]) / served_total, 4)
            if served_total
            else None,
            "bind_p50_ms": ms(binds, 0.5),
            "bind_p99_ms": ms(binds, 0.99),
            "pods_per_s": round(args.measure / elapsed, 1),
            "unschedulable": unschedulable,
            "bind_errors": len(errors),
            "rss_mib": round(memory.get("VmRSS", 0) / 1024, 1),
            "rss_peak_mib": round(memory.get("VmHWM", 0) / 1024, 1),
            "scheduler_children_rss_mib": [
                [round(m.get("VmRSS", 0) / 1024), round(m.get("VmHWM", 0) / 1024)]
                for m in (rss_kib(pid) for pid in children_of(scheduler.pid))
            ],
            "node_metrics_port": args.node_metrics or None,
            "control_plane_rss_mib": {
                name: [round(m.get("VmRSS", 0) / 1024), round(m.get("VmHWM", 0) / 1024)]
                for name, m in plane_memory.items()
            },
            "cpu_ms_per_pod": {name: round(1000 * seconds / args.measure, 2) for name, seconds in cpu.items()},
            "api_requests_per_pod": grown["api_requests"],
            "api_request_body_bytes_per_pod": grown["api_request_body_bytes"],
            "watch_events_per_pod": grown["watch_events"],
            "watch_event_bytes_per_pod": grown["watch_event_bytes"],
            "etcd_requests_per_pod": grown["etcd_requests"],
            "etcd_per_pod": grown["etcd"],
            "load_average": round(os.getloadavg()[0], 2),
        }
        if errors:
            log(f"first bind error: {errors[0]}")
            holder = errors[0].partition("locked by pod ")[2].partition(" ")[0]
            if "/" in holder:  # what the lock's holder looks like now, for the reason it was still held
                pod = api.get("Pod", holder.split("/")[1], NAMESPACE)
                phase = (meta(pod).get("annotations") or {}).get(BIND_PHASE)
                log(f"  its holder {holder} now: node {pod['spec'].get('nodeName')}, bind phase {phase}")
        for key, value in result.items():
            log(f"{key:<18} {value}")
        print(json.dumps(result))
    finally:
        if stand_in is not None:
            stop_node_side.set()
            stand_in.join(10)
        if scheduler is not None:
            scheduler.send_signal(signal.SIGINT)  # a --wrap profiler writes its report on SIGINT
            try:
                scheduler.wait(30)
            except subprocess.TimeoutExpired:
                scheduler.kill()
        plane.stop()
        if args.keep:
            log(f"work folder: {work}")
        else:
            subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
