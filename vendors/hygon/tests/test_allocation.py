"""Allocation and container edits on a fake Hygon node: HAMi's vDCU (the vdev file, CU masks, the driver's virtual
device through the fake DMI), its release and the clean-up after a crash, and the soft mode's edits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.errors import HamiError
from hami.hostpaths import HostPathError
from hami.isolation.grant import parse, write_files
from hami.model import Container, ContainerDevice, Pod

MakeNode = Callable[[list[Any]], Any]
F = Any

POD = Pod(name="train", namespace="ml", uid="uid-1", containers=(Container(name="main"), Container(name="side")))
OTHER = Pod(name="infer", namespace="ml", uid="uid-2", containers=(Container(name="main"),))


def grant(uuid: str, memory: int, cores: int) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=uuid, type="DCU", usedmem=memory, usedcores=cores),)


def setup(hygon_node: MakeNode, fakes: F, source: str = "rsmi", **extra: Any) -> tuple[Any, Any]:
    node = hygon_node(fakes.z100l_server(2))
    plugins = node.plugins(source, **extra)
    plugins.discover()
    return node, plugins


def test_partial_share_gets_hamis_vdev_file_and_a_driver_vdcu(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    placement = grant("DCU-PD23010000", 16384, 50)
    plugins.allocate("DCU", POD, 0, placement)
    assert node.vdevs() == [(0, 0, 30, 16384)]  # 50% of 60 CUs, 16 GiB, on device 0
    (directory,) = (node.directory / "vgpu" / "dcu").iterdir()
    assert directory.name == "uid-1_main_0_0_0_000000003fffffff_0000000000000000"
    body = (directory / "vdev0.conf").read_text()
    assert body == (
        "PciBusId: 0000:10:00.0\n"
        "cu_mask: 0x000000003fffffff\n"
        "cu_mask: 0x0000000000000000\n"
        "cu_count: 30\n"
        "mem: 16384 MiB\n"
        "device_id: 0\n"
        "vdev_id: 0\n"
        "pipe_id: 0\n"
        "enable: 1\n"
    )
    assert (node.directory / "etc-vdev" / "vdev0.conf").read_text() == body  # the exporter's copy
    edits = plugins.container_edits("DCU", POD, 0, placement)
    assert [(d.container_path, d.permissions) for d in edits.devices] == [
        ("/dev/kfd", "rwm"),
        ("/dev/mkfd", "rwm"),
        ("/dev/dri/card1", "rw"),
        ("/dev/dri/renderD128", "rw"),
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/etc/vdev/docker/", str(directory), True),
        ("/opt/hygondriver", "/opt/hygondriver-host", True),
        ("/opt/hyhal", "/opt/hyhal", True),
    ]
    assert edits.env == {}
    assert plugins.container_edits("DCU", POD, 0, placement) == edits


def test_second_share_takes_other_cus_and_the_next_pipe(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    plugins.allocate("DCU", POD, 1, grant("DCU-PD23010000", 8192, 25))
    names = sorted(p.name for p in (node.directory / "vgpu" / "dcu").iterdir())
    assert names == [
        "uid-1_main_0_0_0_000000003fffffff_0000000000000000",
        "uid-1_side_0_1_1_00001fffc0000000_0000000000000000",  # 15 CUs from CU 30 on: no overlap
    ]
    assert node.vdevs() == [(0, 0, 30, 16384), (1, 0, 15, 8192)]


def test_allocate_retried_reuses_the_vdcu(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    placement = grant("DCU-PD23010001", 4096, 10)
    plugins.allocate("DCU", POD, 0, placement)
    plugins.allocate("DCU", POD, 0, placement)
    assert node.vdevs() == [(0, 1, 6, 4096)]


def test_too_few_free_cus_is_refused_with_a_reason(hygon_node: MakeNode, fakes: F) -> None:
    _, plugins = setup(hygon_node, fakes)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 4096, 80))
    with pytest.raises(HamiError, match="12 free compute units, the share needs 30"):
        plugins.allocate("DCU", OTHER, 0, grant("DCU-PD23010000", 4096, 50))


def test_whole_and_multi_dcu_grants_get_no_vdcu(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    whole = grant("DCU-PD23010000", 65536, 100)
    two = grant("DCU-PD23010000", 4096, 10) + grant("DCU-PD23010001", 4096, 10)
    plugins.allocate("DCU", POD, 0, whole)
    plugins.allocate("DCU", POD, 1, two)
    assert node.vdevs() == []
    assert not (node.directory / "vgpu" / "dcu").exists()
    edits = plugins.container_edits("DCU", POD, 1, two)
    assert edits.mounts == ()
    assert [d.host_path for d in edits.devices][2:] == [
        "/dev/dri/card1",
        "/dev/dri/renderD128",
        "/dev/dri/card2",
        "/dev/dri/renderD129",
    ]


def test_release_destroys_the_vdcu_and_its_files(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    plugins.allocate("DCU", OTHER, 0, grant("DCU-PD23010001", 16384, 50))
    plugins.release("DCU", POD, [])
    assert node.vdevs() == [(1, 1, 30, 16384)]
    assert [p.name.split("_")[0] for p in (node.directory / "vgpu" / "dcu").iterdir()] == ["uid-2"]
    assert not (node.directory / "etc-vdev" / "vdev0.conf").exists()
    plugins.release("DCU", POD, [])  # again: nothing left, no error


def test_after_a_crash_masks_are_read_back_and_orphans_destroyed(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    # a daemon that died between creating a vDCU and writing its file left this one behind
    (node.state_file).write_text(node.state_file.read_text() + "5 0 10 1024\n")
    restarted = node.plugins()
    restarted.discover()
    assert node.vdevs() == [(0, 0, 30, 16384)]
    restarted.allocate("DCU", OTHER, 0, grant("DCU-PD23010000", 8192, 50))
    names = sorted(p.name for p in (node.directory / "vgpu" / "dcu").iterdir())
    assert names[1] == "uid-2_main_0_1_1_0fffffffc0000000_0000000000000000"


def test_without_dmi_the_file_alone_describes_the_vdcu(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes, "hy-smi")
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    assert node.vdevs() == []
    (directory,) = (node.directory / "vgpu" / "dcu").iterdir()
    assert "cu_count: 30\n" in (directory / "vdev0.conf").read_text()


def test_driver_refusal_is_a_clear_error(hygon_node: MakeNode, fakes: F, monkeypatch: pytest.MonkeyPatch) -> None:
    node, plugins = setup(hygon_node, fakes)
    monkeypatch.setenv("FAKE_DTK_FAIL", "dmiCreateVDevices")
    with pytest.raises(HamiError, match="creating the vDCU on DCU DCU-PD23010000 failed: dmiCreateVDevices"):
        plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    assert not (node.directory / "vgpu" / "dcu").exists()


def test_edits_before_allocate_are_refused(hygon_node: MakeNode, fakes: F) -> None:
    _, plugins = setup(hygon_node, fakes)
    with pytest.raises(HamiError, match="no vDCU was allocated"):
        plugins.container_edits("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))


def test_unknown_device_is_refused(hygon_node: MakeNode, fakes: F) -> None:
    _, plugins = setup(hygon_node, fakes)
    with pytest.raises(HamiError, match="not on this node"):
        plugins.allocate("DCU", POD, 0, grant("DCU-ELSEWHERE", 16384, 50))


def test_soft_mode_gets_the_isolation_library(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes, dcuMode="hami-core", libvdcuLogLevel="2")
    placement = grant("DCU-PD23010000", 16384, 50)
    plugins.allocate("DCU", POD, 1, placement)
    shmem = node.directory / "hami-core" / "containers" / "uid-1_side"
    assert shmem.is_dir()
    assert node.vdevs() == []
    edits = plugins.container_edits("DCU", POD, 1, placement)
    assert edits.env == {
        "HIP_DEVICE_MEMORY_LIMIT_0": "16384m",
        "HIP_DEVICE_CORE_LIMIT_0": "50",
        "HIP_DEVICE_MEMORY_SHARED_CACHE": "/hami-vdcu-shmem/vdcu.cache",
        "HIP_DEVICE_UUIDS": "DCU-PD23010000",
        "LIBVDCU_LOG_LEVEL": "2",
    }
    hook = node.directory / "hami-core"
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/opt/hyhal", "/opt/hyhal", True),
        (f"{hook}/libvdcu.so", f"{hook}/libvdcu.so", True),
        ("/etc/ld.so.preload", f"{hook}/ld.so.preload", True),
        ("/hami-vdcu-shmem", str(shmem), False),
        ("/etc/hami/grant", f"{hook}/grants/uid-1_side", True),
    ]
    assert edits.accounting_file == str(shmem / "vdcu.cache")
    # the grant the library reads first: the same limits, in files only the node daemon writes
    grant_file = f"{hook}/grants/uid-1_side/hygon.grant"
    assert set(edits.files) == {grant_file, f"{hook}/grants/uid-1_side/hygon.control"}
    assert parse(edits.files[grant_file]).devices[0].memory_bytes == 16384 << 20
    assert parse(edits.files[grant_file]).devices[0].cores == 50
    write_files(edits.files)
    plugins.release("DCU", POD, [])
    assert not shmem.exists()
    assert not (hook / "grants" / "uid-1_side").exists()


def test_a_hostile_pod_uid_cannot_reach_outside_the_containers_directory(hygon_node: MakeNode, fakes: F) -> None:
    """A pod whose UID is `../victim` (as a forged or buggy API object would carry) gets no accounting directory
    outside `containers/`, and its release deletes nothing beside it."""
    node, plugins = setup(hygon_node, fakes, dcuMode="hami-core")
    victim = node.directory / "hami-core" / "victim_keep"
    victim.mkdir(parents=True)
    hostile = POD.model_copy(update={"uid": "../victim"})
    with pytest.raises(HostPathError):
        plugins.container_edits("DCU", hostile, 1, grant("DCU-PD23010000", 16384, 50))
    plugins.release("DCU", hostile, [])
    assert victim.is_dir()


def test_hamis_writable_mounts_are_a_setting(hygon_node: MakeNode, fakes: F) -> None:
    _, plugins = setup(hygon_node, fakes, writableMounts=True)
    placement = grant("DCU-PD23010000", 16384, 50)
    plugins.allocate("DCU", POD, 0, placement)
    assert [m.read_only for m in plugins.container_edits("DCU", POD, 0, placement).mounts] == [False, False, False]


def test_a_tenant_rewriting_its_vdev_file_changes_nothing_the_node_decides(hygon_node: MakeNode, fakes: F) -> None:
    """The tenant (with HAMi's writable mount) rewrites its vDCU's file to claim every CU and another vDCU's id:
    the node's bookkeeping is the directory names and the driver's vDCUs, so the next share still gets CUs of its
    own, and release destroys exactly the tenant's vDCU."""
    node, plugins = setup(hygon_node, fakes, writableMounts=True)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    (directory,) = (node.directory / "vgpu" / "dcu").iterdir()
    conf = directory / "vdev0.conf"
    conf.write_text(
        conf.read_text().replace("0x000000003fffffff", "0xffffffffffffffff").replace("vdev_id: 0", "vdev_id: 1")
    )
    plugins.allocate("DCU", OTHER, 0, grant("DCU-PD23010000", 8192, 25))
    assert node.vdevs() == [(0, 0, 30, 16384), (1, 0, 15, 8192)]
    names = sorted(p.name for p in (node.directory / "vgpu" / "dcu").iterdir())
    assert names[1] == "uid-2_main_0_1_1_00001fffc0000000_0000000000000000"
    plugins.release("DCU", POD, [])
    assert node.vdevs() == [(1, 0, 15, 8192)]


def test_a_restarted_daemon_removes_the_vdcus_of_pods_deleted_while_it_was_down(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    plugins.allocate("DCU", OTHER, 0, grant("DCU-PD23010001", 16384, 50))
    restarted = node.plugins()
    restarted.reconcile("DCU", [OTHER])  # POD was deleted while the daemon was down
    assert node.vdevs() == [(1, 1, 30, 16384)]
    assert [p.name.split("_")[0] for p in (node.directory / "vgpu" / "dcu").iterdir()] == ["uid-2"]
    assert not (node.directory / "etc-vdev" / "vdev0.conf").exists()
    assert (node.directory / "etc-vdev" / "vdev1.conf").exists()
    # the deleted pod's compute units are free again
    third = Pod(name="third", namespace="ml", uid="uid-3", containers=(Container(name="main"),))
    restarted.discover()
    restarted.allocate("DCU", third, 0, grant("DCU-PD23010000", 8192, 50))
    (entry,) = [p.name for p in (node.directory / "vgpu" / "dcu").iterdir() if p.name.startswith("uid-3")]
    assert entry == "uid-3_main_0_0_0_000000003fffffff_0000000000000000"


def test_a_share_the_driver_has_no_room_for_is_refused_with_its_figures(hygon_node: MakeNode, fakes: F) -> None:
    node, plugins = setup(hygon_node, fakes)
    # 50 of device 0's 60 CUs went to a virtual device made after the daemon started, not through it
    node.state_file.write_text("9 0 50 1024\n")
    with pytest.raises(HamiError, match=r"driver has 10 compute units and 64512 MiB .* needs 30 and 16384 MiB"):
        plugins.allocate("DCU", POD, 0, grant("DCU-PD23010000", 16384, 50))
    assert node.vdevs() == [(9, 0, 50, 1024)]
    assert not (node.directory / "vgpu" / "dcu").exists()
