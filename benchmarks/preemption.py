"""Victim selection time (`hami.scheduler.preemption.VictimSelector.select`) on a full cluster.

    python benchmarks/preemption.py --nodes 1000 --devices-per-node 8 --selections 200 --churn 10 --json

Builds the scheduler's `ClusterState` of NODES nodes with DEVICES 16 GiB GPUs each, every card full of
low-priority pods of mixed sizes (2, 4, 6 and 8 GiB, priorities 0-9, ages spread over a month), and times
selections for a high-priority pod asking one card's 12 GiB (the pod fits nowhere without evictions, so every node
is a candidate). Between two selections CHURN nodes each lose a pod and get another (so their memos are rebuilt,
as in a live cluster). The heap is frozen and young collections made rarer once the state is built, as the
scheduler's process does once synced (`SchedulerService`). `cold_select_ms` is a selection after every node's
memo was cleared (a scheduler's first preemption). Baseline in the same run: one plain fit of the same pod over
every node, the vendor call a filter makes anyway. Prints percentiles, last one JSON object: nodes, devices,
pods, select_p50_ms, select_p99_ms, cold_select_ms, churn_nodes, fit_all_nodes_p50_ms, victims.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from typing import Any

from hami.codec import encode_node_register, encode_pod_devices
from hami.model import ContainerDevice, Device, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami.scheduler.preemption import VictimSelector
from hami.scheduler.service import GC_YOUNG_THRESHOLD
from hami.scheduler.state import ClusterState

SIZES = (2048, 4096, 6144, 8192)


def node(name: str, gpus: int) -> dict[str, Any]:
    devices = [
        Device(id=f"GPU-{name}-{i}", index=i, count=10, devmem=16384, devcore=100, type="NVIDIA-A100", numa=i // 4)
        for i in range(gpus)
    ]
    return {
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_register(devices)}},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus * 10)}},
    }


def pod(name: str, node_name: str, card: int, mem: int, priority: int, day: int) -> dict[str, Any]:
    placement = (ContainerDevice(uuid=f"GPU-{node_name}-{card}", type="NVIDIA", usedmem=mem, usedcores=0),)
    return {
        "metadata": {
            "name": name, "namespace": "batch", "uid": f"uid-{name}",
            "creationTimestamp": f"2026-11-{day:02d}T00:00:00Z",
            "annotations": {"hami.io/vgpu-devices-allocated": encode_pod_devices([placement])},
        },
        "spec": {
            "nodeName": node_name,
            "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": f"{mem}"}}}],  # noqa: E501
        },
        "status": {"phase": "Running"},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--selections", type=int, default=200)
    parser.add_argument("--churn", type=int, default=10, help="nodes changed between two selections")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    plugins = VendorPlugins.load(disabled=())
    state = ClusterState(plugins)
    pods = 0
    for n in range(args.nodes):
        name = f"node-{n:04d}"
        state.set_node(node(name, args.devices_per_node))
        for card in range(args.devices_per_node):
            free = 16384
            while free >= SIZES[0]:
                mem = rng.choice([s for s in SIZES if s <= free])
                free -= mem
                state.set_pod(pod(f"p{pods}", name, card, mem, rng.randrange(10), rng.randrange(1, 29)))
                pods += 1
    # as the scheduler's process does once synced (`SchedulerService`): the heap frozen, young collections rarer
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)
    urgent = Pod.from_api(
        {
            "metadata": {"name": "urgent", "namespace": "prod", "uid": "uid-urgent"},
            "spec": {
                "priority": 1000,
                "containers": [
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12288"}}}
                ],
            },
        }
    )
    requests = plugins.pod_requests(urgent)
    policy = SchedulingPolicy()
    names = sorted(state.nodes)
    selector = VictimSelector(plugins, state)
    fit_times, select_times = [], []
    victims = 0
    for _ in range(max(5, args.selections // 10)):
        started = time.perf_counter()
        with state.lock:
            views = [state.nodes[n].views["NVIDIA"] for n in names]
            plugins.fit_nodes("NVIDIA", urgent, requests["NVIDIA"], views, policy)
        fit_times.append((time.perf_counter() - started) * 1000)
    cold_times = []
    for _ in range(3):
        with state.lock:
            for record in state.nodes.values():
                record.memo.clear()
        started = time.perf_counter()
        selector.select(urgent, requests, policy, names)
        cold_times.append((time.perf_counter() - started) * 1000)
    for _ in range(args.selections):
        # churn between selections: --churn nodes each lose a pod and get one (their memos are cleared)
        for n in rng.sample(range(args.nodes), args.churn):
            name = f"node-{n:04d}"
            key = next(iter(sorted(state.nodes[name].pods)))
            gone = state.pods[key]
            state.remove_pod(*key.split("/"))
            card = int(next(iter(gone.grants["NVIDIA"])).rsplit("-", 1)[1])
            mem = next(iter(gone.grants["NVIDIA"].values())).memory
            state.set_pod(pod(f"p{pods}", name, card, mem, rng.randrange(10), rng.randrange(1, 29)))
            pods += 1
        started = time.perf_counter()
        choice = selector.select(urgent, requests, policy, names)
        select_times.append((time.perf_counter() - started) * 1000)
        assert choice is not None, "the benchmark's cluster must have a preemption"
        victims = len(choice.victims)
    select_times.sort()
    result = {
        "nodes": args.nodes,
        "devices": args.nodes * args.devices_per_node,
        "pods": pods,
        "select_p50_ms": round(statistics.median(select_times), 2),
        "select_p99_ms": round(select_times[min(len(select_times) - 1, int(len(select_times) * 0.99))], 2),
        "cold_select_ms": round(statistics.median(cold_times), 2),
        "churn_nodes": args.churn,
        "fit_all_nodes_p50_ms": round(statistics.median(fit_times), 2),
        "victims": victims,
    }
    if not args.json:
        print(f"{pods} running pods on {args.nodes} nodes x {args.devices_per_node} GPUs")
        print(f"selection: p50 {result['select_p50_ms']} ms, p99 {result['select_p99_ms']} ms ({victims} victims)")
        print(f"cold (every node's memo cleared): {result['cold_select_ms']} ms")
        print(f"baseline, one fit over every node: p50 {result['fit_all_nodes_p50_ms']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
