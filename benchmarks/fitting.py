"""The cost of one node fit: a vendor's `hami_fit_nodes` on a batch of candidate nodes, as the extender calls it.

    python benchmarks/fitting.py                      # NVIDIA, 16 nodes x 8 GPUs a call, binpack and spread
    python benchmarks/fitting.py --devices-per-node 16 --batch 16 --calls 2000

The extender fits a pod onto the first batch of candidates in its policy's order (16 nodes under binpack, which
compares their scores); at 1,000 nodes that fit is most of a filter's CPU (`benchmarks/scheduler.py --client
direct` times whole filters). This times the hook alone, through `VendorPlugins` with the installed vendors, on nodes
like those of the scheduler benchmarks: 8 GPUs of 10 slots, 81,920 MiB and 100 % cores each, every node with a
different usage (1-6 running shares of 1,000 MiB and 10 % cores per device), and pods asking 1 GPU with 1,000 MiB
and 10 % cores. Prints, per device policy, microseconds of CPU per node fitted (p50 of the calls); the last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from hami.model import Device, DeviceUsage, NodeView, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins


def nodes(count: int, devices: int, seed: int) -> list[NodeView]:
    rng = random.Random(seed)
    views = []
    for n in range(count):
        usages = []
        for i in range(devices):
            device = Device(
                id=f"GPU-node-{n}-{i}", index=i, count=10, devmem=81920, devcore=100, type="NVIDIA-H100", numa=i // 4
            )
            shares = rng.randint(1, 6)
            usages.append(DeviceUsage(device=device, used=shares, usedmem=1000 * shares, usedcores=10 * shares))
        views.append(NodeView(name=f"node-{n}", devices=usages))
    return views


def pod(index: int) -> Pod:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    return Pod.from_api(
        {
            "metadata": {"name": f"new-{index}", "namespace": "bench", "uid": f"uid-{index}"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="nodes per hook call (the extender's batch size)")
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    plugins = VendorPlugins.load()
    views = nodes(args.batch, args.devices_per_node, seed=1)
    result: dict[str, object] = {"batch": args.batch, "devices_per_node": args.devices_per_node}
    for device_policy in ("spread", "binpack"):
        policy = SchedulingPolicy(node="binpack", device=(device_policy,))
        times = []
        for i in range(args.calls):
            p = pod(i)
            requests = plugins.pod_requests(p)["NVIDIA"]
            started = time.process_time()
            fits = plugins.fit_nodes("NVIDIA", p, requests, views, policy)
            times.append(time.process_time() - started)
            assert all(f.placement is not None for f in fits), fits
        per_node = 1e6 * statistics.median(times) / args.batch
        print(f"{device_policy:<8} {per_node:7.1f} us CPU per node fitted (p50 over {args.calls} calls)")
        result[f"{device_policy}_us_per_node"] = round(per_node, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
