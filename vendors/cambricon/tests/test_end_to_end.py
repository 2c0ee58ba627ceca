"""Cambricon from CNDev to the container, with hami-core's real services on an in-memory cluster: the node side
discovers the fake CNDev machine and publishes it, the scheduler's filter places a dynamic-sMLU share and writes the
profile and assigned flags, bind locks the node, and the node side's Allocate answers the kubelet with Cambricon's
env and device nodes, marks the pod assigned and releases HAMi's ``cambricon.com/dsmlu.lock``. A pod placed as HAMi's
own scheduler places it (capacity names ``<node>-cambricon-mlu-<i>``) is served on the same cards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from hami.cluster import MemoryCluster, meta
from hami.node.allocate import AllocationError, Allocator
from hami.node.pods import ServedPods
from hami.node.register import NodeRegistrar
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.scheduler.service import SchedulerService
from hami_vendor_cambricon import plugin
from hami_vendor_cambricon.cndev import Cndev

NODE = "mlu-node"
UUIDS = [f"MLU-a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(4)]
TO_ALLOCATE = "hami.io/cambricon-mlu-devices-to-allocate"


def mlu_pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c0", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@dataclass
class World:
    cluster: MemoryCluster
    node_plugins: VendorPlugins
    scheduler: SchedulerService
    allocator: Allocator

    def annotations(self, kind: str, name: str, namespace: str = "") -> dict[str, str]:
        return dict(meta(self.cluster.get(kind, name, namespace)).get("annotations") or {})


@pytest.fixture
def world(mlu_node: Callable[..., VendorPlugins]) -> Iterator[World]:
    node_plugins = mlu_node()
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": NODE}})
    inventories = {i.kind: i for i in node_plugins.discover()["cambricon"]}
    NodeRegistrar(cluster, node_plugins, NODE).sync(inventories)
    cluster.flush()
    scheduler = SchedulerService(cluster, VendorPlugins.from_plugins({"cambricon": plugin})).start()
    allocator = Allocator(cluster, node_plugins, NODE, on_served=ServedPods(node_plugins).record)
    yield World(cluster, node_plugins, scheduler, allocator)
    scheduler.stop()


def test_a_dsmlu_share_from_filter_to_the_container(world: World) -> None:
    limits = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "25", "cambricon.com/mlu.smlu.vmemory": "16"}
    world.cluster.create("pods", mlu_pod("share", limits, {"hami.io/gpu-scheduler-policy": "binpack"}))
    result = world.scheduler.extender.filter(world.cluster.get("pods", "share", "default"), [NODE])
    assert result.node == NODE, result.failed
    got = world.annotations("pods", "share", "default")
    assert got[TO_ALLOCATE] == f"{UUIDS[3]},MLU,4096,25:;"  # HAMi's string; equal scores: the highest index
    assert (got["CAMBRICON_DSMLU_PROFILE"], got["CAMBRICON_DSMLU_ASSIGNED"], got["CAMBRICON_DSMLU_ASSIGHED"]) == (
        "3_25_16",
        "false",
        "false",
    )
    uid = meta(world.cluster.get("pods", "share", "default"))["uid"]
    assert world.scheduler.extender.bind("default", "share", uid, NODE).error == ""
    assert "cambricon.com/dsmlu.lock" in world.annotations("nodes", NODE)  # taken at bind, as HAMi's scheduler does

    (edits,) = world.allocator.allocate("MLU", [[UUIDS[3]]])
    cap = "/dev/cambricon-caps/cap_dev3_mi1"  # the sMLU instance made for the container
    assert dict(edits.env) == {"VIRTUAL_DEVICES": f"/dev/cambricon_dev3,/dev/cambricon_ipcm3,{cap}"}
    assert [d.host_path for d in edits.devices] == ["/dev/cambricon_dev3", cap, "/dev/cambricon_ctl"]
    after = world.annotations("pods", "share", "default")
    assert (after[BIND_PHASE], after[TO_ALLOCATE]) == ("success", ";")
    assert after["CAMBRICON_DSMLU_ASSIGNED"] == after["CAMBRICON_DSMLU_ASSIGHED"] == "true"
    assert after["CAMBRICON_DSMLU_PROFILE_INSTANCE"] == "1_259_3_1"
    assert "cambricon.com/dsmlu.lock" not in world.annotations("nodes", NODE)


def test_a_pod_placed_by_hamis_scheduler_is_served_on_the_named_card(world: World) -> None:
    # What HAMi v2.10's scheduler writes for a node it read from capacity: capacity names, the dsmlu lock, no
    # hami.io/mutex.lock; the node side finds the pod as the only one allocating here.
    placed = f"{NODE}-cambricon-mlu-2,MLU,24576,100:;"
    annotations = {TO_ALLOCATE: placed, "hami.io/cambricon-mlu-devices-allocated": placed, BIND_PHASE: "allocating",
                   "CAMBRICON_DSMLU_PROFILE": "2_100_96", "CAMBRICON_DSMLU_ASSIGNED": "false"}  # fmt: skip
    obj = mlu_pod("from-hami", {"cambricon.com/vmlu": "1"}, annotations)
    obj["spec"]["nodeName"] = NODE
    world.cluster.create("pods", obj)
    world.cluster.patch_metadata("nodes", NODE, annotations={"cambricon.com/dsmlu.lock": "2026-12-01T23:00:00Z"})
    (edits,) = world.allocator.allocate("MLU", [[UUIDS[2]]])
    assert dict(edits.env) == {"CAMBRICON_VISIBLE_DEVICES": "2"}
    assert world.annotations("pods", "from-hami", "default")[BIND_PHASE] == "success"
    assert "cambricon.com/dsmlu.lock" not in world.annotations("nodes", NODE)


def test_a_dsmlu_lock_of_hamis_scheduler_holds_our_bind_until_it_is_released(world: World) -> None:
    # A mixed fleet: HAMi's scheduler bound an MLU pod here and took only cambricon.com/dsmlu.lock.
    fresh = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    world.cluster.patch_metadata("nodes", NODE, annotations={"cambricon.com/dsmlu.lock": fresh})
    world.cluster.create("pods", mlu_pod("whole", {"cambricon.com/vmlu": "1"}))
    assert world.scheduler.extender.filter(world.cluster.get("pods", "whole", "default"), [NODE]).node == NODE
    uid = meta(world.cluster.get("pods", "whole", "default"))["uid"]
    refused = world.scheduler.extender.bind("default", "whole", uid, NODE).error
    assert "locked by cambricon.com/dsmlu.lock" in refused
    assert "retry" in refused
    assert "nodeName" not in world.cluster.get("pods", "whole", "default")["spec"]
    world.cluster.patch_metadata("nodes", NODE, annotations={"cambricon.com/dsmlu.lock": None})  # HAMi's pod served
    assert world.scheduler.extender.bind("default", "whole", uid, NODE).error == ""
    (edits,) = world.allocator.allocate("MLU", [[UUIDS[3]]])
    assert dict(edits.env) == {"CAMBRICON_VISIBLE_DEVICES": "3"}
    assert "cambricon.com/dsmlu.lock" not in world.annotations("nodes", NODE)


def test_an_allocate_that_fails_leaves_neither_lock_behind(world: World) -> None:
    # the card is full of other sMLUs (made outside this scheduler's view): the share cannot be made at Allocate
    session = Cndev.open(world.node_plugins.vendor("cambricon").settings.cndev_library)
    session.create_instance(0, session.create_profile(0, 90, 1024 * 1024 * 1024), "made-by-an-admin")
    limits = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "25", "cambricon.com/mlu.smlu.vmemory": "4"}
    world.cluster.create("pods", mlu_pod("share", limits, {"cambricon.com/use-gpuuuid": UUIDS[0]}))
    assert world.scheduler.extender.filter(world.cluster.get("pods", "share", "default"), [NODE]).node == NODE
    uid = meta(world.cluster.get("pods", "share", "default"))["uid"]
    assert world.scheduler.extender.bind("default", "share", uid, NODE).error == ""
    with pytest.raises(AllocationError, match=r"making an sMLU of 25 % and 1024 MiB on MLU 0 .*insufficient space"):
        world.allocator.allocate("MLU", [[UUIDS[0]]])
    assert world.annotations("pods", "share", "default")[BIND_PHASE] == "failed"
    held = world.annotations("nodes", NODE)
    assert "hami.io/mutex.lock" not in held
    assert "cambricon.com/dsmlu.lock" not in held  # taken with the mutex at bind, released with it
