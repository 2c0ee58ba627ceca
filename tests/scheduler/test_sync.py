"""The scheduler's start-up sync leaves no cyclic garbage behind: the heap is frozen after it without a collection,
so a reference cycle it dropped would stay for the life of the process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from scheduler_harness import gpu_node, gpu_pod

from hami.cluster.memory import MemoryCluster
from hami.codec import encode_pod_devices
from hami.model import ContainerDevice


def placed_pod(name: str, node: str, device: int) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    allocated = encode_pod_devices(
        [(ContainerDevice(uuid=f"GPU-{node}-{device}", type="NVIDIA", usedmem=3000, usedcores=10),)]
    )
    pod["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": allocated, "hami.io/bind-phase": "success"}
    return pod


def cluster_of(nodes: int, pods: int) -> MemoryCluster:
    cluster = MemoryCluster()
    for n in range(nodes):
        cluster.create("nodes", gpu_node(f"node-{n}"))
    for i in range(pods):
        cluster.create("pods", placed_pod(f"running-{i}", f"node-{i % nodes}", (i // nodes) % 8))
    return cluster


GARBAGE_AFTER_SYNC = """
import gc, sys
sys.path[:0] = sys.argv[1:]
from test_sync import cluster_of
from hami.plugins import VendorPlugins
from hami.scheduler.service import SchedulerService
cluster = cluster_of(40, 320)
service = SchedulerService(cluster, VendorPlugins.load(), placement_keys=None)
gc.collect()
service.start()
frozen = gc.get_freeze_count()
gc.unfreeze()
print(frozen, gc.collect(), len(service.state.pods))
service.stop()
"""


def test_the_sync_leaves_no_cyclic_garbage_for_the_freeze_to_keep() -> None:
    """The sync freezes the heap without collecting first: any reference cycle it dropped would stay for good.
    Measured in a fresh interpreter, where no earlier test's threads and services end meanwhile."""
    here = Path(__file__).resolve().parent
    answer = subprocess.run(
        [sys.executable, "-c", GARBAGE_AFTER_SYNC, str(here), str(here.parent / "support")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    frozen, unreachable, counted = (int(x) for x in answer.stdout.split())
    assert counted == 320  # the sync did its work: every placed pod counted
    assert frozen > 10_000  # the sync's heap (and the interpreter's) is out of later passes
    assert unreachable == 0, f"the sync left {unreachable} objects in reference cycles"
