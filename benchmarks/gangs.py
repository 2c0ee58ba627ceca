"""Gang placement (`hami.scheduler.gangs`): the time to place a gang, and ordinary pods' filter latency beside gangs.

    python benchmarks/gangs.py --nodes 1000 --devices-per-node 8 --gang-size 16 --json

Builds an in-memory cluster of NODES nodes x DEVICES GPUs holding PODS running pods, starts the real scheduler
service (decisions written at bind, as `hami scheduler` runs) and calls its extender in process, as
`benchmarks/scheduler.py --client direct` does. First MEASURE ordinary pods are scheduled alone (the baseline);
then GANGS gangs of GANG_SIZE members (1 GPU and 8000 MiB each) are placed, one ordinary pod scheduled after each
gang member's filter, and the ordinary pods' filter latency is measured again. A stand-in for the node daemon
marks bound pods allocated and releases their node lock. The last line is one JSON object: gang_hold_ms (the
first member's filter, which decides and holds the whole gang), gang_place_ms (from it to the last member's
bind), and filter_p50_ms / filter_p99_ms of ordinary pods alone and beside gangs (`_with_gangs`).

With `--island-gangs K` the nodes publish NVLink islands of four GPUs (NVIDIA's link scores, as its discovery
writes them) and K more gangs follow, their members asking their GPUs within one island
(`hami.io/gang-topology: island`, `hami.islands`): island_hold_ms_median / island_place_ms_median beside the plain
gangs' figures of the same run (`--gpus-per-member 2` makes the island matter: one GPU is always within one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from scheduler import NodeSideStandIn, percentile, pod, running_cluster

from hami.cluster import meta
from hami.codec import encode_link_scores
from hami.islands import GANG_TOPOLOGY_ANNOTATION, ISLAND
from hami.plugins import VendorPlugins
from hami.scheduler.extender import Extender, ExtenderSettings
from hami.scheduler.podgroups import GANG_ANNOTATION, GANG_SIZE_ANNOTATION
from hami.scheduler.service import SchedulerService


def member(gang: int, index: int, size: int, gpus: int = 1, island: bool = False) -> dict[str, Any]:
    """A member of `gpus` GPUs of 8000 MiB and 50 % cores each; with `island`, within one island."""
    obj = pod(f"gang{gang}-{index}")
    obj["metadata"]["annotations"] = {GANG_ANNOTATION: f"gang{gang}", GANG_SIZE_ANNOTATION: str(size)}
    limits = obj["spec"]["containers"][0]["resources"]["limits"]
    limits.update({"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "50"})
    limits["nvidia.com/gpu"] = str(gpus)
    if island:
        obj["metadata"]["annotations"][GANG_TOPOLOGY_ANNOTATION] = ISLAND
    return obj


def publish_islands(cluster: Any, names: list[str], devices: int) -> None:
    """NVLink islands of four GPUs on every node (two NVLinks and a shared board within, a host bridge across)."""
    for name in names:
        ids = [f"GPU-{name}-{i}" for i in range(devices)]
        scores = {
            a: {b: 260 if i // 4 == j // 4 else 30 for j, b in enumerate(ids) if b != a} for i, a in enumerate(ids)
        }
        node = cluster.get("nodes", name)
        node["metadata"]["annotations"]["hami.io/node-nvidia-score"] = encode_link_scores(scores)
        cluster.replace("nodes", node)


def place_gang(
    extender: Extender, members: list[dict[str, Any]], names: list[str], ordinary: Any, beside: list[float]
) -> tuple[float, float]:
    """Each member's filter (an ordinary pod scheduled after each), then every bind: (the first member's filter,
    the whole gang from its first filter to its last bind, less the ordinary pods' time), in seconds."""
    started = time.perf_counter()
    hold = 0.0
    ordinary_time = 0.0
    placed: list[tuple[dict[str, Any], str]] = []
    for index, obj in enumerate(members):
        t0 = time.perf_counter()
        result = extender.filter(obj, names)
        if index == 0:
            hold = time.perf_counter() - t0
        if not result.node:
            raise SystemExit(f"gang member {meta(obj)['name']} not placed: {result.error or result.failed}")
        placed.append((obj, result.node))
        t1 = time.perf_counter()
        beside.append(schedule(extender, next(ordinary), names))
        ordinary_time += time.perf_counter() - t1
    for obj, target in placed:
        bound = extender.bind("bench", meta(obj)["name"], meta(obj)["uid"], target)
        if bound.error:
            raise SystemExit(f"gang bind failed: {bound.error}")
    return hold, time.perf_counter() - started - ordinary_time


def schedule(extender: Extender, obj: dict[str, Any], names: list[str]) -> float:
    """Filter and bind one ordinary pod; the filter's seconds."""
    t0 = time.perf_counter()
    result = extender.filter(obj, names)
    took = time.perf_counter() - t0
    if not result.node:
        raise SystemExit(f"ordinary pod {meta(obj)['name']} not placed: {result.error or result.failed}")
    bound = extender.bind("bench", meta(obj)["name"], meta(obj)["uid"], result.node)
    if bound.error:
        raise SystemExit(f"bind failed: {bound.error}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=4000, help="running pods the cluster holds before")
    parser.add_argument("--measure", type=int, default=200, help="ordinary pods scheduled alone (baseline)")
    parser.add_argument("--gangs", type=int, default=8)
    parser.add_argument("--gang-size", type=int, default=16)
    parser.add_argument("--island-gangs", type=int, default=0, help="gangs kept within NVLink islands, after")
    parser.add_argument("--gpus-per-member", type=int, default=1, help="GPUs each gang member asks")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    cluster, names = running_cluster(args.nodes, args.devices_per_node, args.pods)
    if args.island_gangs:
        publish_islands(cluster, names, args.devices_per_node)
    settings = ExtenderSettings(record_at_bind=True, pass_over_nodes_in_flight=True)
    service = SchedulerService(cluster, VendorPlugins.load(), settings).start()
    extender = service.extender
    stand_in = NodeSideStandIn(cluster)
    total_gangs = args.gangs + args.island_gangs
    ordinary = [cluster.create("pods", pod(f"new-{i}")) for i in range(args.measure + total_gangs * args.gang_size)]
    gangs = [
        [
            cluster.create("pods", member(g, i, args.gang_size, args.gpus_per_member, g >= args.gangs))
            for i in range(args.gang_size)
        ]
        for g in range(total_gangs)
    ]
    cluster.flush()
    time.sleep(0.5)  # the watch delivers every pending pod before the clock starts

    alone = [schedule(extender, obj, names) for obj in ordinary[: args.measure]]
    beside: list[float] = []
    rest = iter(ordinary[args.measure :])
    timed = [place_gang(extender, members, names, rest, beside) for members in gangs]
    holds, places = [h for h, _ in timed[: args.gangs]], [p for _, p in timed[: args.gangs]]
    islands = timed[args.gangs :]
    beside = beside[: args.gangs * args.gang_size]  # ordinary pods beside the plain gangs, as before
    stand_in.sub.stop()
    service.stop()

    result = {
        "nodes": args.nodes,
        "devices_per_node": args.devices_per_node,
        "running_pods": args.pods,
        "gang_size": args.gang_size,
        "gpus_per_member": args.gpus_per_member,
        "gangs": args.gangs,
        "gang_hold_ms_median": round(1000 * statistics.median(holds), 2),
        "gang_hold_ms_max": round(1000 * max(holds), 2),
        "gang_place_ms_median": round(1000 * statistics.median(places), 2),
        "filter_p50_ms": round(1000 * percentile(alone, 0.50), 3),
        "filter_p99_ms": round(1000 * percentile(alone, 0.99), 3),
        "filter_p50_ms_with_gangs": round(1000 * percentile(beside, 0.50), 3),
        "filter_p99_ms_with_gangs": round(1000 * percentile(beside, 0.99), 3),
    }
    if islands:
        result["island_gangs"] = len(islands)
        result["island_hold_ms_median"] = round(1000 * statistics.median(h for h, _ in islands), 2)
        result["island_place_ms_median"] = round(1000 * statistics.median(p for _, p in islands), 2)
    if not args.json:
        for key, value in result.items():
            print(f"{key:<28} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
