"""The scheduler's start-up sync: it leaves no cyclic garbage behind (the heap is frozen after it without a
collection, so a reference cycle it dropped would stay for the life of the process), and pods read a page at a time
count as a whole list does, a list that expires part-way listed again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_harness import gpu_node, gpu_pod

from hami.cluster import ClusterError, meta
from hami.cluster.memory import MemoryCluster
from hami.cluster.port import ListPages, Resource
from hami.codec import encode_pod_devices
from hami.model import ContainerDevice
from hami.plugins import VendorPlugins
from hami.scheduler.service import SchedulerService


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


class PagedCluster(MemoryCluster):
    """Lists pods `per_page` at a time (as `KubeCluster.list_pages` does); the first `expire` lists of them end with
    410 after their first page (a continue token older than the API server's compaction), and `before_list` runs
    before each list of pods (a deletion between two lists)."""

    def __init__(self, per_page: int = 3, expire: int = 0) -> None:
        super().__init__()
        self.per_page = per_page
        self.expire = expire
        self.lists = 0
        self.before_list: Callable[[int], None] = lambda attempt: None

    def list_pages(self, resource: Resource, namespace: str | None = None) -> ListPages:
        self.lists += 1
        self.before_list(self.lists)
        items, version = self.list(resource, namespace)
        expires = self.lists <= self.expire

        def pages() -> Iterator[list[dict[str, Any]]]:
            for start in range(0, len(items), self.per_page):
                if expires and start:
                    raise ClusterError("list pods: the continue token has expired", 410, "Expired")
                yield items[start : start + self.per_page]

        return ListPages(pages(), lambda: version)


def synced(cluster: MemoryCluster) -> SchedulerService:
    return SchedulerService(cluster, VendorPlugins.load(), placement_keys=None).start()


def test_a_sync_that_reads_its_pods_in_pages_counts_what_a_whole_list_counts() -> None:
    paged = PagedCluster(per_page=3)
    whole = cluster_of(4, 17)
    for resource in ("nodes", "pods"):
        for obj in whole.list(resource)[0]:
            paged.create(resource, obj)
    services = [synced(paged), synced(whole)]
    try:
        (a, b) = services
        assert paged.lists == 1
        assert a.state.usage_snapshot() == b.state.usage_snapshot()
        assert sorted(a.state.pods) == sorted(b.state.pods)
        assert len(a.state.pods) == 17
        assert a.state.cpu_memory == b.state.cpu_memory
    finally:
        for service in services:
            service.stop()


def test_a_pod_list_that_expires_part_way_is_listed_again_and_what_went_meanwhile_is_forgotten() -> None:
    cluster = PagedCluster(per_page=2, expire=1)
    for n in range(2):
        cluster.create("nodes", gpu_node(f"node-{n}"))
    for i in range(5):
        cluster.create("pods", placed_pod(f"running-{i}", f"node-{i % 2}", i // 2))
    gang = {"scheduling.x-k8s.io/pod-group": "team"}  # a coscheduling gang member
    cluster.create("pods", {**gpu_pod("first"), "metadata": {"name": "first", "namespace": "default", "labels": gang}})
    listed = sorted((meta(p)["namespace"], meta(p)["name"], meta(p)["uid"]) for p in cluster.list("pods")[0])
    deleted = listed[0]  # the gang member: in the expired list's first page, deleted before the second list
    assert deleted[1] == "first"

    def delete_between(attempt: int) -> None:
        if attempt == 2:
            cluster.delete("pods", deleted[1], deleted[0])

    cluster.before_list = delete_between
    service = synced(cluster)
    try:
        assert cluster.lists == 2
        assert not service.extender.pending.seen(*deleted)
        assert not service.extender.gangs.member(deleted[0], deleted[1])
        assert len(service.state.pods) == 5
    finally:
        service.stop()


def test_a_pod_list_that_keeps_expiring_fails_the_sync() -> None:
    cluster = PagedCluster(per_page=1, expire=99)
    for i in range(3):
        cluster.create("pods", placed_pod(f"running-{i}", "node-0", i))
    with pytest.raises(ClusterError) as raised:
        synced(cluster)
    assert raised.value.status == 410
    assert cluster.lists == 3
