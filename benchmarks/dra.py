"""DRA on the node: how long building the node's ResourceSlice takes, and one claim's NodePrepareResources +
NodeUnprepareResources round trip over the plugin's unix socket (claim read, the node's pods counted, the
vendor's hooks, the CDI spec and the record written and removed), with the test suite's scripted vendor and an
in-memory cluster holding `--pods` device-plugin pods on the node.

    python benchmarks/dra.py [--devices 8] [--pods 100] [--rounds 200] [--json]

Prints one line per measure and, last, one JSON object (microseconds for the slice, milliseconds for the round
trip: median and p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import grpc
import scripted_vendor
from node_harness import NODE, scripted_devices, write_script

from hami.cluster import MemoryCluster
from hami.codec import encode_pod_devices
from hami.dra.plugin import DraPlugin
from hami.dra.proto import dra_pb2 as pb
from hami.dra.proto import dra_pb2_grpc as pb_grpc
from hami.dra.slices import SlicePublisher, build_slice
from hami.model import ContainerDevice
from hami.plugins import VendorPlugins

DRIVER = "hami.io"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--pods", type=int, default=100, help="device-plugin pods bound to the node")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hami-dra-bench-"))
    script = write_script(work / "script.json", {"Scripted": scripted_devices(args.devices, count=1000, devmem=81920)})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    inventories = {inv.kind: inv for inv in plugins.discover()["scripted"]}
    rounds = max(args.rounds, 10)
    start = time.perf_counter()
    for _ in range(rounds):
        build_slice(plugins, NODE, DRIVER, inventories)
    slice_us = (time.perf_counter() - start) / rounds * 1e6

    cluster = MemoryCluster()
    allocated = scripted_vendor.SCRIPTED.annotations.allocated
    for i in range(args.pods):
        held = encode_pod_devices([(ContainerDevice(uuid=f"SCR-{i % args.devices}", type="Scripted", usedmem=10),)])
        cluster.create("pods", {
            "metadata": {"name": f"p{i}", "namespace": "bench", "annotations": {allocated: held}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}, "status": {"phase": "Running"},
        })  # fmt: skip
    publisher = SlicePublisher(cluster, plugins, NODE, DRIVER)
    publisher.sync(inventories)
    plugin = DraPlugin(
        cluster, plugins, NODE, DRIVER, lambda: publisher.devices,
        plugin_dir=work / "plugins", registry_dir=work / "registry", cdi_dir=work / "cdi",
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(plugin.start(), loop).result(30)
    claim = cluster.create("resourceclaims", {"metadata": {"name": "c", "namespace": "bench", "uid": "uid-c"}})
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": DRIVER, "pool": NODE, "device": "scripted-0", "shareID": "s",
        "consumedCapacity": {f"{DRIVER}/memory": "4Gi", f"{DRIVER}/cores": "30", f"{DRIVER}/shares": "1"},
    }]}}}  # fmt: skip
    cluster.replace("resourceclaims", claim)
    ref = [pb.Claim(namespace="bench", name="c", uid="uid-c")]
    times: list[float] = []
    with grpc.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        for _ in range(rounds):
            begin = time.perf_counter()
            answer = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=ref), timeout=30)
            stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=ref), timeout=30)
            times.append((time.perf_counter() - begin) * 1000)
            assert answer.claims["uid-c"].error == "", answer
    asyncio.run_coroutine_threadsafe(plugin.stop(0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    times.sort()
    results = {
        "build_slice_us": round(slice_us, 1),
        "prepare_unprepare_median_ms": round(statistics.median(times), 3),
        "prepare_unprepare_p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
    }
    if not args.json:
        for name, value in results.items():
            print(f"{name:<30} {value}")
    print(json.dumps({"devices": args.devices, "pods": args.pods, "rounds": rounds, **results}))


if __name__ == "__main__":
    main()
