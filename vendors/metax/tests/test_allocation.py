"""Allocation and container edits on a fake MetaX node: MetaX's device plugins' answer (device nodes, visible
devices, driver and SDK mounts), the node's records and what discovery publishes from them, release, HAMi's
capacity names for whole cards, and a hostile pod UID."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from hami.errors import HamiError
from hami.hostpaths import HostPathError
from hami.isolation.grant import parse, write_files
from hami.model import Container, ContainerDevice, Pod

MakeNode = Callable[[list[Any]], Any]
F = Any
SGPU, GPU = "Metax-SGPU", "Metax-GPU"

POD = Pod(
    name="train",
    namespace="ml",
    uid="uid-1",
    annotations={"metax-tech.com/sgpu-qos-policy": "fixed-share"},
    containers=(Container(name="main"), Container(name="side")),
)
OTHER = Pod(name="infer", namespace="ml", uid="uid-2", containers=(Container(name="main"),))


def share(uuid: str, memory: int = 16384, cores: int = 30, kind: str = SGPU) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=uuid, type=kind, usedmem=memory, usedcores=cores),)


def setup(metax_node: MakeNode, fakes: F, count: int = 4, **extra: Any) -> tuple[Any, Any]:
    node = metax_node(fakes.c500_server(count))
    h = node.plugins(**extra)
    h.discover()
    return node, h


def entries(h: Any) -> list[dict[str, Any]]:
    (inventory,) = h.discover()["metax"]
    return json.loads(inventory.annotations["metax-tech.com/node-gpu-devices"])  # type: ignore[no-any-return]


def test_a_share_gets_the_cards_nodes_visible_devices_and_mounts(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes)
    uuid = node.gpus[2].uuid
    allocation = h.allocate(SGPU, POD, 0, share(uuid))
    assert [d.uuid for d in allocation.devices] == [uuid]
    edits = h.container_edits(SGPU, POD, 0, allocation.devices)
    assert [(d.container_path, d.host_path, d.permissions) for d in edits.devices] == [
        ("/dev/mxcd", "/dev/mxcd", "rwm"),
        ("/dev/dri/card3", "/dev/dri/card3", "rw"),
        ("/dev/dri/renderD130", "/dev/dri/renderD130", "rw"),
    ]
    assert edits.env == {"METAX_VISIBLE_DEVICES": "2", "MACA_VISIBLE_DEVICES": "0"}
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/opt/mxdriver", "/opt/mxdriver-host", True),
        ("/opt/maca", "/opt/maca", True),
    ]
    assert h.container_edits(SGPU, POD, 0, allocation.devices) == edits


def test_two_cards_are_numbered_from_zero_inside(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes)
    placement = share(node.gpus[3].uuid, cores=100) + share(node.gpus[1].uuid, cores=100)
    edits = h.container_edits(SGPU, POD, 0, h.allocate(SGPU, POD, 0, placement).devices)
    assert edits.env == {"METAX_VISIBLE_DEVICES": "3,1", "MACA_VISIBLE_DEVICES": "0,1"}
    assert [d.host_path for d in edits.devices][1:] == [
        "/dev/dri/card4",
        "/dev/dri/renderD131",
        "/dev/dri/card2",
        "/dev/dri/renderD129",
    ]


def test_served_shares_are_published_back_and_released(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes)
    uuid = node.gpus[0].uuid
    h.allocate(SGPU, POD, 0, share(uuid, 16384, 30))
    h.allocate(SGPU, POD, 1, share(uuid, 8192, 20))
    h.allocate(SGPU, POD, 1, share(uuid, 8192, 20))  # a retry rewrites the same record
    first = entries(h)[0]
    assert (first["availableDevCount"], first["availableCompute"], first["availableVRam"]) == (14, 50, 40960)
    assert first["qosPolicy"] == "fixed-share"
    h.release(SGPU, POD, [])
    first = entries(h)[0]
    assert (first["availableDevCount"], first["availableCompute"], first["availableVRam"]) == (16, 100, 65536)
    assert "qosPolicy" not in first
    h.release(SGPU, POD, [])  # again: nothing left, no error


def test_after_a_restart_what_pods_gone_meanwhile_held_is_forgotten(metax_node: MakeNode, fakes: F) -> None:
    """A pod deleted while the node daemon was down is never released: without the restart's reconcile its record
    kept the card's shares, compute, memory and QoS policy published as taken, and its directories stayed."""
    node, h = setup(metax_node, fakes, sgpuMode="hami-core")
    uuid = node.gpus[0].uuid
    h.allocate(SGPU, POD, 0, share(uuid, 16384, 30))
    h.allocate(SGPU, OTHER, 0, share(uuid, 8192, 20))
    hook = node.directory / "metax"
    (hook / "allocations" / ".record-crashed").write_text("{")  # a write a crash cut short
    first = entries(h)[0]
    assert (first["availableDevCount"], first["availableCompute"], first["availableVRam"]) == (14, 50, 40960)
    h.reconcile(SGPU, [OTHER])  # what the restarted daemon finds still on the node
    first = entries(h)[0]
    assert (first["availableDevCount"], first["availableCompute"], first["availableVRam"]) == (15, 80, 57344)
    assert sorted(p.name for p in (hook / "allocations").iterdir()) == ["uid-2_main.json"]
    assert sorted(p.name for p in (hook / "containers").iterdir()) == ["uid-2_main"]
    h.reconcile(SGPU, [])
    first = entries(h)[0]
    assert (first["availableDevCount"], first["availableCompute"], first["availableVRam"]) == (16, 100, 65536)
    assert "qosPolicy" not in first
    assert not list((hook / "containers").iterdir())


def test_whole_cards_placed_by_hamis_scheduler_are_resolved_by_index(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes, nodeKind="gpu")
    placement = share("worker-1-metax-1", 0, 100, GPU) + share("worker-1-metax-3", 0, 100, GPU)
    allocation = h.allocate(GPU, OTHER, 0, placement)
    assert [d.uuid for d in allocation.devices] == [node.gpus[1].uuid, node.gpus[3].uuid]
    assert h.container_edits(GPU, OTHER, 0, allocation.devices).env["METAX_VISIBLE_DEVICES"] == "1,3"
    # the served cards leave MetaX's topology tables: two free cards are left, on one MetaXLink
    (inventory,) = h.discover()["metax"]
    assert json.loads(inventory.annotations["metax-tech.com/gpu.topology.scores"]) == {"1": 0, "2": 10}


def test_unknown_card_is_refused(metax_node: MakeNode, fakes: F) -> None:
    _, h = setup(metax_node, fakes)
    with pytest.raises(HamiError, match="not on this node"):
        h.allocate(SGPU, POD, 0, share("GPU-elsewhere"))


def test_card_without_drm_nodes_is_refused(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes)
    drm = node.directory / "sys" / "bus" / "pci" / "devices" / node.gpus[0].bdf / "drm"
    for child in drm.iterdir():
        child.rmdir()
    with pytest.raises(HamiError, match="no DRM card and render node"):
        h.container_edits(SGPU, POD, 0, share(node.gpus[0].uuid))


def test_a_hostile_pod_uid_cannot_reach_outside_the_records(metax_node: MakeNode, fakes: F) -> None:
    """A pod whose UID is `../victim` gets no record outside `allocations/`, and its release deletes nothing
    beside it."""
    node, h = setup(metax_node, fakes)
    victim = node.directory / "metax" / "victim_keep"
    victim.mkdir(parents=True)
    hostile = POD.model_copy(update={"uid": "../victim"})
    with pytest.raises(HostPathError):
        h.allocate(SGPU, hostile, 0, share(node.gpus[0].uuid))
    h.release(SGPU, hostile, [])
    assert victim.is_dir()


def test_a_corrupt_record_counts_as_nothing(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes)
    records = node.directory / "metax" / "allocations"
    records.mkdir(parents=True)
    (records / "uid-9_main.json").write_text("{not json")
    assert entries(h)[0]["availableDevCount"] == 16


def test_soft_mode_gives_a_share_the_isolation_library_and_its_grant(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes, sgpuMode="hami-core", logLevel="2")
    uuid = node.gpus[1].uuid
    devices = h.allocate(SGPU, POD, 1, share(uuid, 16384, 30)).devices
    hook = node.directory / "metax"
    shmem = hook / "containers" / "uid-1_side"
    assert shmem.is_dir()
    edits = h.container_edits(SGPU, POD, 1, devices)
    assert edits.env == {
        "METAX_VISIBLE_DEVICES": "1",
        "MACA_VISIBLE_DEVICES": "0",
        "MACA_DEVICE_MEMORY_LIMIT_0": "16384m",
        "MACA_DEVICE_CORE_LIMIT_0": "30",
        "MACA_DEVICE_MEMORY_SHARED_CACHE": "/hami-vmaca-shmem/vmaca.cache",
        "MACA_DEVICE_UUIDS": uuid,
        "LIBVMACA_LOG_LEVEL": "2",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/opt/mxdriver", "/opt/mxdriver-host", True),
        ("/opt/maca", "/opt/maca", True),
        (f"{hook}/libvmaca.so", f"{hook}/libvmaca.so", True),
        ("/etc/ld.so.preload", f"{hook}/ld.so.preload", True),
        ("/hami-vmaca-shmem", str(shmem), False),
        ("/etc/hami/grant", f"{hook}/grants/uid-1_side", True),
    ]
    assert edits.accounting_file == str(shmem / "vmaca.cache")
    grant_file = f"{hook}/grants/uid-1_side/metax.grant"
    assert grant_file in edits.files
    parsed = parse(edits.files[grant_file]).devices[0]
    assert (parsed.memory_bytes, parsed.cores) == (16384 << 20, 30)
    write_files(edits.files)
    h.release(SGPU, POD, [])
    assert not shmem.exists()
    assert not (hook / "grants" / "uid-1_side").exists()


def test_whole_cards_get_no_library_in_soft_mode(metax_node: MakeNode, fakes: F) -> None:
    node, h = setup(metax_node, fakes, sgpuMode="hami-core", nodeKind="gpu")
    edits = h.container_edits(GPU, OTHER, 0, h.allocate(GPU, OTHER, 0, share(node.gpus[0].uuid, 0, 100, GPU)).devices)
    assert "MACA_DEVICE_MEMORY_LIMIT_0" not in edits.env
    assert edits.accounting_file is None
