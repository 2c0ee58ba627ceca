"""The scheduler's metrics scrape at cluster size: CPU and peak memory of one `/metrics` rendering.

    python benchmarks/scheduler_metrics.py                    # 1,000 nodes x 8 GPUs, 8,000 running pods
    python benchmarks/scheduler_metrics.py --nodes 5000 --pods 40000

Builds the in-memory cluster of benchmarks/scheduler.py, syncs the real scheduler service from it, then renders
the scheduler's metrics --repeat times as a scrape does (`SchedulerMetrics.render`) and, as the baseline in the
same run, through prometheus_client's own `generate_latest` over the same registry (what the render replaced; the
two texts must be byte for byte the same). For each: the CPU seconds per scrape (median) and the peak of memory
the scrape allocates above what the process held before it (tracemalloc, one scrape traced on its own).
Prometheus scrapes every 15-30 s, and the scheduler's resident memory budget is 250 MiB at this size: the peak
is what a scrape adds to it. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

from prometheus_client import generate_latest
from scheduler import node, pod

from hami.cluster import MemoryCluster
from hami.plugins import VendorPlugins
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.service import SchedulerService


def measure(render: Callable[[], bytes], repeat: int) -> tuple[float, float, int]:
    """(CPU seconds per render, median; peak MiB one render allocates; bytes of text)."""
    seconds = []
    size = 0
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        size = len(render())
        seconds.append(time.process_time() - t0)
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    text = render()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del text
    return statistics.median(seconds), peak / 2**20, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=8000, help="running pods already placed")
    parser.add_argument("--repeat", type=int, default=5, help="scrapes timed per rendering")
    args = parser.parse_args()

    cluster = MemoryCluster()
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    for name in names:
        cluster.create("nodes", node(name, args.devices_per_node))
    for i in range(args.pods):
        n = i % args.nodes
        device = f"GPU-{names[n]}-{(i // args.nodes) % args.devices_per_node}"
        cluster.create("pods", pod(f"running-{i}", node_name=names[n], device=device))
    service = SchedulerService(cluster, VendorPlugins.load(), ExtenderSettings()).start()
    try:
        metrics = service.metrics
        if metrics.render() != generate_latest(metrics.registry):
            raise SystemExit("the direct rendering differs from prometheus_client's: a bug in the exposition")
        direct_s, direct_peak, size = measure(metrics.render, args.repeat)
        client_s, client_peak, _ = measure(lambda: generate_latest(metrics.registry), args.repeat)
    finally:
        service.stop()
    result = {
        "nodes": args.nodes,
        "devices_per_node": args.devices_per_node,
        "running_pods": args.pods,
        "text_mib": round(size / 2**20, 2),
        "render_cpu_s": round(direct_s, 3),
        "render_peak_mib": round(direct_peak, 1),
        "prometheus_client_cpu_s": round(client_s, 3),
        "prometheus_client_peak_mib": round(client_peak, 1),
    }
    for key, value in result.items():
        print(f"{key:<28} {value}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
