"""MIG from the scheduler's filter to the hardware and back, with hami-core's real services on an in-memory
cluster: the extender reserves a placement in ``hami.io/vgpu-mig-allocations``, later pods see it as occupied
(before and after the watch, and after a scheduler restart), the node side's Allocate creates the instance at
exactly that placement in the fake NVML and writes its identity back, and the release of the finished pod
destroys it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.cluster import MemoryCluster, meta
from hami.codec import MigReservation, decode_mig_allocations
from hami.node.allocate import Allocator
from hami.node.pods import ServedPods
from hami.node.register import NodeRegistrar
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.scheduler.service import SchedulerService
from hami_vendor_nvidia.mig import MIG_ALLOCATIONS_ANNOTATION, MIG_INSTANCES_ANNOTATION, Placement

NODE = "gpu-node"


def mig_pod(name: str, memory: int, gpu: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory)}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"nvidia.com/vgpu-mode": "mig", "nvidia.com/use-gpuuuid": gpu},
        },
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@dataclass
class World:
    """One MIG node (fake NVML behind the node side's host), its Node object, and a running scheduler."""

    machine: Any
    cluster: MemoryCluster
    node_host: VendorPlugins
    scheduler: SchedulerService
    served: ServedPods
    allocator: Allocator
    gpus: list[str] = field(default_factory=list)

    def publish(self) -> None:
        """A discovery round of the node daemon: the node's register and MIG instances annotations."""
        (inventory,) = self.node_host.discover()["nvidia"]
        NodeRegistrar(self.cluster, self.node_host, NODE).sync({"NVIDIA": inventory})
        self.cluster.flush()

    def filter(self, name: str, memory: int, gpu: str) -> MigReservation:
        obj = self.cluster.create("pods", mig_pod(name, memory, gpu))
        result = self.scheduler.extender.filter(obj, [NODE])
        assert result.node == NODE, result.failed
        (reservation,) = decode_mig_allocations(self.annotations(name)[MIG_ALLOCATIONS_ANNOTATION])
        return reservation

    def annotations(self, name: str) -> dict[str, str]:
        return dict(meta(self.cluster.get("pods", name, "default")).get("annotations") or {})

    def restart_scheduler(self) -> None:
        self.scheduler.stop()
        self.scheduler = SchedulerService(self.cluster, VendorPlugins.from_plugins({"nvidia": plugin})).start()

    def mig_calls(self) -> list[tuple[str, str, int, int, int]]:
        return [
            (c["call"], c["gpu"], c["start"], c["size"], c["result"])
            for c in self.machine.calls()
            if c["call"] in ("create_gpu_instance", "destroy_gpu_instance")
        ]


@pytest.fixture
def world(gpu_node: Callable[..., Any], boxes: Any) -> Iterator[World]:
    machine = gpu_node(boxes.a100_mig())
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": NODE}})
    node_host = machine.plugins()
    served = ServedPods(node_host)
    scheduler = SchedulerService(cluster, VendorPlugins.from_plugins({"nvidia": plugin})).start()
    w = World(
        machine, cluster, node_host, scheduler, served, Allocator(cluster, node_host, NODE, on_served=served.record)
    )
    w.gpus = [d["uuid"] for d in machine.box["devices"]]
    w.publish()
    yield w
    w.scheduler.stop()


def place(r: MigReservation) -> Placement:
    return Placement(r.start, r.size)


def test_a_mig_pod_is_reserved_created_at_its_placement_and_destroyed_after_it_finishes(world: World) -> None:
    gpu0 = world.gpus[0]
    first = world.filter("first", 8000, gpu0)
    assert (first.container_index, first.device_index, first.gpu_uuid, first.profile) == (0, 0, gpu0, "1g.10gb")
    assert first.mig_uuid == ""  # the node side has created nothing yet

    second = world.filter("second", 8000, gpu0)  # no flush: the first pod is known only by the assumption
    assert second.gpu_uuid == gpu0
    assert not place(second).overlaps(place(first))

    uid = meta(world.cluster.get("pods", "first", "default"))["uid"]
    assert world.scheduler.extender.bind("default", "first", uid, NODE).error == ""
    (edits,) = world.allocator.allocate("NVIDIA", [[f"{gpu0}-0"]])
    assert world.mig_calls() == [("create_gpu_instance", gpu0, first.start, first.size, 0)]
    mig_uuid = edits.env["NVIDIA_VISIBLE_DEVICES"]
    assert mig_uuid.startswith("MIG-")
    assert edits.mounts == ()  # the hardware partition is the isolation: no library, no preload

    got = world.annotations("first")
    assert got[BIND_PHASE] == "success"
    (done,) = decode_mig_allocations(got[MIG_ALLOCATIONS_ANNOTATION])
    assert (done.gpu_uuid, done.profile, done.start, done.size) == (gpu0, "1g.10gb", first.start, first.size)
    (inventory,) = world.node_host.discover()["nvidia"]
    (instance,) = [i for i in json.loads(inventory.annotations[MIG_INSTANCES_ANNOTATION]) if i["gpuUUID"] == gpu0]
    assert (done.mig_uuid, done.gpu_instance_id, done.compute_instance_id) == (
        instance["migUUID"],
        instance["gpuInstanceID"],
        instance["computeInstanceID"],
    )  # what NVML says the instance is
    assert done.mig_uuid == mig_uuid

    world.cluster.delete("pods", "first", "default")
    assert world.served.sweep(world.cluster) == ["default/first"]
    assert world.mig_calls()[-1] == ("destroy_gpu_instance", gpu0, first.start, first.size, 0)


def test_reservations_stay_occupied_through_the_watch_the_hardware_report_and_a_scheduler_restart(
    world: World,
) -> None:
    gpu0 = world.gpus[0]
    first = world.filter("first", 8000, gpu0)
    uid = meta(world.cluster.get("pods", "first", "default"))["uid"]
    world.scheduler.extender.bind("default", "first", uid, NODE)
    world.allocator.allocate("NVIDIA", [[f"{gpu0}-0"]])
    second = world.filter("second", 8000, gpu0)  # reserved, not created: the node has not seen it yet
    world.publish()  # the node now reports the first pod's instance too
    assert gpu0 in world.cluster.get("nodes", NODE)["metadata"]["annotations"][MIG_INSTANCES_ANNOTATION]

    world.restart_scheduler()  # the new scheduler knows the reservations only from the pods' annotations
    with world.scheduler.state.lock:
        pods = world.scheduler.state.nodes[NODE].views["NVIDIA"].pods
        assert {key: p.annotations[MIG_ALLOCATIONS_ANNOTATION] for key, p in pods.items()} == {
            "default/first": world.annotations("first")[MIG_ALLOCATIONS_ANNOTATION],
            "default/second": world.annotations("second")[MIG_ALLOCATIONS_ANNOTATION],
        }
    third = world.filter("third", 19000, gpu0)
    assert third.profile == "3g.20gb"
    assert not any(place(third).overlaps(place(r)) for r in (first, second))
