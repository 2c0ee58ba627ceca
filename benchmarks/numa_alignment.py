"""What `hami.io/numa-alignment` costs the filter, and what it buys: two-GPU pods without it, best-effort, strict.

    python benchmarks/numa_alignment.py --nodes 1000 --devices-per-node 8 --measure 300 --json

Builds an in-memory cluster of NODES nodes x DEVICES GPUs (NUMA node = index // 4, as `scheduler.node`
registers them) where every GPU but the last of each NUMA node holds one running pod (1000 MiB), so the device
policy's own choice for two GPUs (spread: the emptiest, the last of each NUMA node) spans both NUMA nodes. Starts
the real scheduler service (decisions written at bind) and calls its extender in process, as
`benchmarks/scheduler.py --client direct` does: MEASURE pods of each kind (2 GPUs x 1000 MiB; no annotation,
`best-effort`, `strict`), interleaved so all three see the same cluster as it fills, each filtered against every
node and bound. A stand-in for the node daemon marks bound pods allocated. Prints per kind the filter p50/p99
(ms), the share of placed pods whose GPUs share one NUMA node, and the pods left unplaced; the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from scheduler import NodeSideStandIn, node, percentile, pod

from hami.cluster import MemoryCluster, meta
from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.service import SchedulerService

KINDS = {"none": None, "best_effort": "best-effort", "strict": "strict"}
PLACED = "hami.io/vgpu-devices-to-allocate"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--measure", type=int, default=300, help="pods of each kind scheduled and timed")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    devices = args.devices_per_node

    cluster = MemoryCluster()
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    numa: dict[str, int] = {}
    for name in names:
        obj = node(name, devices)
        cluster.create("nodes", obj)
        for i in range(devices):
            numa[f"GPU-{name}-{i}"] = i // 4
            if i % 4 != 3 and i != devices - 1:
                device = f"GPU-{name}-{i}"
                cluster.create("pods", pod(f"running-{name}-{i}", node_name=name, device=device))
    settings = ExtenderSettings(node_policy="spread", record_at_bind=True, pass_over_nodes_in_flight=True)
    service = SchedulerService(cluster, VendorPlugins.load(), settings).start()
    stand_in = NodeSideStandIn(cluster)
    extender = service.extender
    pods: list[tuple[str, dict[str, Any]]] = []
    for i in range(args.measure):
        for kind, alignment in KINDS.items():
            obj = pod(f"{kind}-{i}")
            obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
            if alignment is not None:
                obj["metadata"]["annotations"]["hami.io/numa-alignment"] = alignment
            pods.append((kind, cluster.create("pods", obj)))
    time.sleep(0.5)  # the watch delivers the new pending pods before the clock starts

    filters: dict[str, list[float]] = {k: [] for k in KINDS}
    aligned = dict.fromkeys(KINDS, 0)
    unplaced = dict.fromkeys(KINDS, 0)
    for kind, obj in pods:
        t0 = time.perf_counter()
        result = extender.filter(obj, names)
        filters[kind].append(time.perf_counter() - t0)
        if not result.node:
            unplaced[kind] += 1
            continue
        bound = extender.bind("bench", meta(obj)["name"], meta(obj)["uid"], result.node)
        if bound.error:
            raise SystemExit(f"bind failed: {bound.error}")
        annotations = cluster.get("pods", meta(obj)["name"], "bench")["metadata"]["annotations"]
        (container,) = decode_pod_devices(annotations[PLACED], PLACED)
        aligned[kind] += len({numa[d.uuid] for d in container}) == 1
    stand_in.sub.stop()
    service.stop()

    result: dict[str, Any] = {"nodes": args.nodes, "devices_per_node": devices, "measured_per_kind": args.measure}
    for kind in KINDS:
        placed = args.measure - unplaced[kind]
        result[f"{kind}_filter_p50_ms"] = round(1000 * percentile(filters[kind], 0.50), 3)
        result[f"{kind}_filter_p99_ms"] = round(1000 * percentile(filters[kind], 0.99), 3)
        result[f"{kind}_aligned_share"] = round(aligned[kind] / placed, 3) if placed else None
        result[f"{kind}_unplaced"] = unplaced[kind]
    if not args.json:
        for key, value in result.items():
            print(f"{key:<26} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
