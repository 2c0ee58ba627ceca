"""Ascend from the node's driver to the container, with hami-core's real services on an in-memory cluster: the node
side discovers the fake DCMI machine and registers it, the scheduler's filter places pods and writes the pod
annotations exactly as HAMi v2.10 does for the same placements, and the node side's Allocate answers the kubelet with
Ascend's container runtime env (and, for a soft split, the installed isolation library and the container's
accounting directory, removed again once the pod is gone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hami.cluster import MemoryCluster, meta
from hami.isolation.grant import DeviceGrant, parse
from hami.model import Mount
from hami.node.allocate import Allocator
from hami.node.hooklib import IsolationLibraries
from hami.node.pods import ServedPods
from hami.node.register import NodeRegistrar
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.scheduler.service import SchedulerService
from hami_vendor_ascend import plugin

NODE = "npu-node"
B3 = "Ascend910B3"


def npu_pod(name: str, *containers: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": f"c{i}", "resources": {"limits": limits}} for i, limits in enumerate(containers)],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class World:
    """One Ascend node (the fake DCMI behind the node side's host), its Node object, and a running scheduler."""

    node: Any
    cluster: MemoryCluster
    node_host: VendorPlugins
    scheduler: SchedulerService
    served: ServedPods
    allocator: Allocator
    libraries: IsolationLibraries

    def publish(self) -> None:
        """A discovery round of the node daemon: the node's register annotations."""
        inventories = {i.kind: i for i in self.node_host.discover()["ascend"]}
        NodeRegistrar(self.cluster, self.node_host, NODE).sync(inventories)
        self.cluster.flush()

    def place(self, obj: dict[str, Any]) -> dict[str, str]:
        created = self.cluster.create("pods", obj)
        result = self.scheduler.extender.filter(created, [NODE])
        assert result.node == NODE, result.failed
        return self.annotations(obj["metadata"]["name"])

    def annotations(self, name: str) -> dict[str, str]:
        return dict(meta(self.cluster.get("pods", name, "default")).get("annotations") or {})

    def bind(self, name: str) -> None:
        uid = meta(self.cluster.get("pods", name, "default"))["uid"]
        assert self.scheduler.extender.bind("default", name, uid, NODE).error == ""


@pytest.fixture
def world_of(ascend_node: Callable[..., Any], machines: Any, tmp_path: Path) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**settings: Any) -> World:
        node = ascend_node(machines.b3_server(4))
        node_host = node.plugins(hookPath=str(tmp_path / "hook"), **settings)
        cluster = MemoryCluster()
        cluster.create("nodes", {"metadata": {"name": NODE}})
        libraries = IsolationLibraries(tmp_path / "hooks")
        libraries.install(node_host.vendor("ascend"))
        served = ServedPods(node_host)
        scheduler = SchedulerService(cluster, VendorPlugins.from_plugins({"ascend": plugin})).start()
        allocator = Allocator(cluster, node_host, NODE, on_served=served.record, library_of=libraries.for_vendor)
        world = World(node, cluster, node_host, scheduler, served, allocator, libraries)
        world.publish()
        made.append(world)
        return world

    yield make
    for world in made:
        world.scheduler.stop()


def test_template_shares_and_whole_cards_from_filter_to_the_container(world_of: Callable[..., World]) -> None:
    world = world_of()
    u = [n.uuid for n in world.node.npus]
    got = world.place(npu_pod("job", {"huawei.com/Ascend910B3-memory": "8000"}, {"huawei.com/Ascend910B3": "1"}))
    # exactly what HAMi v2.10 writes for this placement (equal scores: the highest index first)
    assert got["hami.io/Ascend910B3-devices-to-allocate"] == f"{u[3]},Ascend910B3,16384,0:;{u[2]},Ascend910B3,65536,0:;"
    assert got["hami.io/Ascend910B3-devices-allocated"] == got["hami.io/Ascend910B3-devices-to-allocate"]
    assert got["huawei.com/Ascend910B3"] == (
        f'[{{"UUID":"{u[3]}","temp":"vir05_1c_16g","memory":16384}},{{"UUID":"{u[2]}","memory":65536}}]'
    )
    assert got["hami.io/vgpu-node"] == NODE
    assert got["predicate-time"].isdigit()  # HAMi's Ascend fit writes the decision's unix seconds

    world.bind("job")
    share, card = world.allocator.allocate(B3, [[f"{u[3]}-0"], [f"{u[2]}-0"]])
    assert dict(share.env) == {"ASCEND_VISIBLE_DEVICES": "3", "ASCEND_VNPU_SPECS": "vir05_1c_16g"}
    assert dict(card.env) == {"ASCEND_VISIBLE_DEVICES": "2"}
    assert share.mounts == card.mounts == ()  # the vNPU and the whole card are the hardware's isolation
    after = world.annotations("job")
    assert after[BIND_PHASE] == "success"
    assert after["hami.io/Ascend910B3-devices-to-allocate"] == ";;"  # served, positions kept


def test_the_register_and_later_pods_see_what_earlier_ones_took(world_of: Callable[..., World]) -> None:
    world = world_of()
    register = world.cluster.get("nodes", NODE)["metadata"]["annotations"]
    assert register["hami-vnpu-core"] == "false"
    assert '"custominfo":{"NetworkID":0}' in register["hami.io/node-register-Ascend910B3"]
    u = [n.uuid for n in world.node.npus]
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    first = world.place(npu_pod("a", {"huawei.com/Ascend910B3-memory": "30000"}, annotations=binpack))
    second = world.place(npu_pod("b", {"huawei.com/Ascend910B3-memory": "30000"}, annotations=binpack))
    third = world.place(npu_pod("c", {"huawei.com/Ascend910B3-memory": "30000"}, annotations=binpack))
    key = "hami.io/Ascend910B3-devices-allocated"
    assert [first[key], second[key], third[key]] == [
        f"{u[3]},Ascend910B3,32768,0:;",
        f"{u[3]},Ascend910B3,32768,0:;",  # two vir10_3c_32g fill a 64 GiB chip
        f"{u[2]},Ascend910B3,32768,0:;",
    ]


def test_a_soft_split_share_gets_the_installed_library_and_its_accounting_directory(
    world_of: Callable[..., World], tmp_path: Path
) -> None:
    world = world_of(hamiVnpuCore=True)
    assert world.cluster.get("nodes", NODE)["metadata"]["annotations"]["hami-vnpu-core"] == "true"
    u = [n.uuid for n in world.node.npus]
    soft = {"huawei.com/vnpu-mode": "hami-core"}
    limits = {"huawei.com/Ascend910B3-memory": "16384", "huawei.com/Ascend910B3-core": "30"}
    got = world.place(npu_pod("soft", limits, annotations=soft))
    assert got["hami.io/Ascend910B3-devices-allocated"] == f"{u[3]},Ascend910B3,16384,30:;"
    assert got["huawei.com/Ascend910B3"] == f'[{{"UUID":"{u[3]}","memory":16384,"core":30}}]'

    world.bind("soft")
    (edits,) = world.allocator.allocate(B3, [[f"{u[3]}-0"]])
    uid = meta(world.cluster.get("pods", "soft", "default"))["uid"]
    directory = tmp_path / "hook" / "containers" / f"{uid}_c0"
    library = world.libraries.for_vendor("ascend")
    assert library is not None
    assert Path(library.path).resolve().is_file()  # the build shipped in the package, installed on the host
    assert edits.env["ASCEND_DEVICE_MEMORY_LIMIT_0"] == "16384m"
    assert edits.env["ASCEND_DEVICE_CORE_LIMIT_0"] == "30"
    assert Mount(container_path=library.path, host_path=library.path) in edits.mounts
    assert Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path) in edits.mounts
    assert Mount(container_path="/hami-vnpu-shmem", host_path=str(directory), read_only=False) in edits.mounts
    assert directory.is_dir()
    assert edits.accounting_file == str(directory / "vnpu.cache")
    # the node daemon wrote the grant before answering, read-only to the container, outside its writable mounts
    grant_file = tmp_path / "hook" / "grants" / f"{uid}_c0" / "ascend.grant"
    assert Mount(container_path="/etc/hami/grant", host_path=str(grant_file.parent)) in edits.mounts
    assert parse(grant_file.read_text()).devices == (DeviceGrant(16384 << 20, 30, u[3]),)
    assert grant_file.stat().st_mode & 0o777 == 0o644
    # the backstop writes the container's host pids there (GRANT.md "pids"): the served record names it, and so
    # does the one a restarted daemon makes from the pod
    (record,) = world.served.containers()
    assert record.grant_dir == str(grant_file.parent)
    restarted = ServedPods(world.node_host)
    assert restarted.load([world.cluster.get("pods", "soft", "default")], NODE) == 1
    assert [c.grant_dir for c in restarted.containers()] == [str(grant_file.parent)]

    world.cluster.delete("pods", "soft", "default")
    assert world.served.sweep(world.cluster) == ["default/soft"]
    assert not directory.exists()
    assert not grant_file.parent.exists()
