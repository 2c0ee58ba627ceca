"""The dashboard at cluster size: the time to serve each page, with usage from every node daemon and without.

    python benchmarks/dashboard.py                  # 1,000 nodes x 8 GPUs, 8,000 running pods
    python benchmarks/dashboard.py --nodes 200 --repeat 5

Builds the in-memory cluster of benchmarks/scheduler.py (pods placed one per device share, creation times set), and
for every node the text its daemon's `/metrics` would answer: the real `hami.node.monitor` over the node's 8 devices
and the containers placed there, with device readings and container usage (`NodeMonitor.render`). The usage
collector reads those texts through its `fetch` (no sockets: what is timed is the dashboard's own work), one round
timed (CPU and wall). Then each page (`/`, `/workloads`, a node, a device, a pod) is served --repeat times through
`DashboardApp.handle` from a snapshot already read (the source reads the cluster at most once a second; cold reads
are timed on their own, wall and CPU, median of --cold, beside a baseline in the same run: the same listing and
snapshot with Python's cycle collector left running, as before the read held it off), as the first page after a new
snapshot (the figures pages memoise on a snapshot forgotten before each), with usage and, as the baseline in the
same run, without (no node metrics); then as the pages after it (memoised). The budget is 300 ms per page at 1,000
nodes (the first page after a snapshot). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler import node, pod

from hami.cluster import MemoryCluster
from hami.cluster.port import meta
from hami.dashboard.app import DashboardApp
from hami.dashboard.source import DashboardSource
from hami.dashboard.usage import UsageCollector
from hami.dashboard.views import take_snapshot
from hami.model import ContainerDevice, Device, DeviceReading, NodeInventory
from hami.node.monitor import ContainerUsage, NodeMonitor
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins

BUDGET_MS = 300.0
MIB = 1 << 20


def metrics_text(name: str, devices: int, pods: list[tuple[str, str]]) -> str:
    """What node `name`'s daemon answers: its devices with readings, and each (pod, device) placed there."""
    inventory = {
        "NVIDIA": NodeInventory(
            kind="NVIDIA",
            devices=tuple(
                Device(id=f"GPU-{name}-{i}", index=i, count=10, devmem=81920, type="NVIDIA-H100")
                for i in range(devices)
            ),
        )
    }
    served = [
        ServedContainer(
            "bench", p, f"uid-{p}", "main", 0, "NVIDIA",
            (ContainerDevice(uuid=d, type="NVIDIA", usedmem=1000, usedcores=10),),
        )
        for p, d in pods
    ]  # fmt: skip
    usage = [
        ContainerUsage(f"uid-{p}", "main", d, memory_used_bytes=(100 + n * 37 % 900) * MIB, utilization_ratio=0.05)
        for n, (p, d) in enumerate(pods)
    ]
    readings = [
        DeviceReading(
            device_uuid=f"GPU-{name}-{i}", memory_used_bytes=(i * 5000) * MIB, utilization_percent=i * 12 % 100,
            power_watts=120 + i * 30, temperature_celsius=40 + i,
        )
        for i in range(devices)
    ]  # fmt: skip
    monitor = NodeMonitor(
        name, lambda: inventory, lambda: served, container_usage=lambda: usage, device_usage=lambda: readings
    )
    return monitor.render().decode()


def time_pages(app: DashboardApp, paths: list[str], repeat: int, *, fresh: bool) -> dict[str, dict[str, float]]:
    """Per path: median and max milliseconds of `handle` (wall), every answer a 200. `fresh`: each time as the
    first page after a new snapshot (what pages memoise on it forgotten first), else as the pages after it."""
    out = {}
    for path in paths:
        samples = []
        for _ in range(repeat):
            gc.collect()
            if fresh:
                reading = app.source.read()
                assert reading.snapshot is not None
                reading.snapshot.memo.clear()
            t0 = time.perf_counter()
            status, _, body = app.handle("GET", path)
            samples.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                raise SystemExit(f"{path} answered {status}: {body[:300]!r}")
        out[path] = {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=8000, help="running pods already placed")
    parser.add_argument("--repeat", type=int, default=7, help="times each page is served")
    parser.add_argument("--cold", type=int, default=3, help="cold reads of the cluster timed, and as many baselines")
    args = parser.parse_args()

    started = time.perf_counter()
    cluster = MemoryCluster()
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    for name in names:
        cluster.create("nodes", node(name, args.devices_per_node))
    per_node: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
    created = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(args.pods):
        n = names[i % args.nodes]
        device = f"GPU-{n}-{(i // args.nodes) % args.devices_per_node}"
        obj = pod(f"running-{i}", node_name=n, device=device)
        obj["metadata"]["creationTimestamp"] = created
        cluster.create("pods", obj)
        per_node[n].append((f"running-{i}", device))
    texts = {n: metrics_text(n, args.devices_per_node, per_node[n]) for n in names}
    plugins = VendorPlugins.load()
    built = time.perf_counter() - started

    collector = UsageCollector("http://{node}/metrics", cluster, fetch=lambda url, _timeout: texts[url.split("/")[2]])
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    collector.collect()
    collect_cpu, collect_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    collector.collect()  # a second round, for the trends
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    collector.collect()
    round_peak = (tracemalloc.get_traced_memory()[1] - base) / MIB
    tracemalloc.stop()

    def unheld() -> None:  # the baseline: the same listing and snapshot, the cycle collector running throughout
        items = [cluster.list(resource)[0] for resource in ("nodes", "pods", "events")]
        take_snapshot(*items, plugins, now=datetime.now(UTC))

    cold: dict[str, list[tuple[float, float]]] = {"read": [], "baseline": []}
    for _ in range(args.cold):
        for what, read in (
            ("read", lambda: DashboardSource(cluster, plugins, max_age=3600.0).read()),
            ("baseline", unheld),
        ):
            gc.collect()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            read()
            cold[what].append(((time.perf_counter() - wall0) * 1000, (time.process_time() - cpu0) * 1000))
    cold_read_ms = statistics.median(w for w, _ in cold["read"])
    cold_read_cpu_ms = statistics.median(c for _, c in cold["read"])
    baseline_ms = statistics.median(w for w, _ in cold["baseline"])
    baseline_cpu_ms = statistics.median(c for _, c in cold["baseline"])
    source = DashboardSource(cluster, plugins, max_age=3600.0)
    source.read()
    with_usage = DashboardApp(source, usage=collector)
    without = DashboardApp(source)
    first = names[0]
    paths = ["/", "/workloads", f"/nodes/{first}", f"/devices/GPU-{first}-0", "/pods/bench/running-0"]
    with_usage.handle("GET", "/")  # the templates compiled once, as on a running dashboard
    usage_pages = time_pages(with_usage, paths, args.repeat, fresh=True)
    plain_pages = time_pages(without, paths, args.repeat, fresh=True)
    warm_pages = time_pages(with_usage, paths, args.repeat, fresh=False)
    worst = max(p["median_ms"] for p in usage_pages.values())
    collector.stop()

    width = max(len(p) for p in paths)
    print(f"{args.nodes} nodes x {args.devices_per_node} devices, {args.pods} pods (built in {built:.1f} s)")
    print(
        f"usage round: {collect_cpu * 1000:.0f} ms CPU, {collect_wall * 1000:.0f} ms wall, peak +{round_peak:.1f} MiB"
    )
    print(
        f"cold read of the cluster (nodes, pods, events, accounting), median of {args.cold}: {cold_read_ms:.0f} ms"
        f" wall, {cold_read_cpu_ms:.0f} ms CPU; with the cycle collector running: {baseline_ms:.0f} ms wall,"
        f" {baseline_cpu_ms:.0f} ms CPU"
    )
    print("first page after a new snapshot, with usage and without; then later pages on the same snapshot")
    print(f"{'page':<{width}}  with usage (median / max)   without (median / max)   later (median / max)")
    for p in paths:
        u, b, w = usage_pages[p], plain_pages[p], warm_pages[p]
        print(
            f"{p:<{width}}  {u['median_ms']:>8.1f} / {u['max_ms']:>7.1f} ms    {b['median_ms']:>8.1f} / "
            f"{b['max_ms']:>7.1f} ms    {w['median_ms']:>8.1f} / {w['max_ms']:>7.1f} ms"
        )
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "devices": args.nodes * args.devices_per_node,
        "pods": args.pods,
        "usage_round_cpu_ms": round(collect_cpu * 1000, 1),
        "usage_round_wall_ms": round(collect_wall * 1000, 1),
        "usage_round_peak_mib": round(round_peak, 1),
        "cold_read_ms": round(cold_read_ms, 1),
        "cold_read_cpu_ms": round(cold_read_cpu_ms, 1),
        "cold_read_collector_running_ms": round(baseline_ms, 1),
        "cold_read_collector_running_cpu_ms": round(baseline_cpu_ms, 1),
        "pages_with_usage": usage_pages,
        "pages_without_usage": plain_pages,
        "pages_later_with_usage": warm_pages,
        "worst_page_median_ms": worst,
        "budget_ms": BUDGET_MS,
        "within_budget": worst <= BUDGET_MS,
        "first_node": meta(cluster.get("nodes", first))["name"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
