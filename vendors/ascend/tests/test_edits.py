"""Container edits and allocation: the env Ascend's container runtime expects (physical ids, the vNPU template),
and in soft-split mode the isolation library, its environment and mounts, and the container's accounting directory
prepared before the container starts and removed after the pod is gone."""

from __future__ import annotations

import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from hami.errors import HamiError
from hami.model import Container, ContainerDevice, IsolationLibrary, Mount, Pod

NodeFactory = Callable[..., Any]
B3 = "Ascend910B3"
SOFT = {"huawei.com/vnpu-mode": "hami-core"}
HAMI_DRIVER_MOUNTS = (
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/version.info",
)


def pod(annotations: Mapping[str, str] | None = None) -> Pod:
    return Pod(
        name="job", namespace="ml", uid="uid-1234", annotations=dict(annotations or {}),
        init_containers=(Container(name="setup"),), containers=(Container(name="train"), Container(name="eval")),
    )  # fmt: skip


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type=B3, usedmem=m, usedcores=c) for u, m, c in devices)


@pytest.fixture
def b3(ascend_node: NodeFactory, machines: Any) -> Any:
    """An eight-910B3 server whose physical ids are 10..17 (logic ids 0..7), so the two are told apart."""
    npus = [n.__class__(**{**n.__dict__, "phy": 10 + n.phy}) for n in machines.b3_server()]
    return ascend_node(npus)


def test_a_template_share_gets_its_physical_id_and_template(b3: Any) -> None:
    plugins = b3.plugins()
    edits = plugins.container_edits(B3, pod(), 1, placed((b3.npus[3].uuid, 16384, 0)))
    assert dict(edits.env) == {"ASCEND_VISIBLE_DEVICES": "13", "ASCEND_VNPU_SPECS": "vir05_1c_16g"}
    assert edits.mounts == ()
    assert edits.accounting_file is None


def test_whole_cards_get_their_physical_ids_in_placement_order_and_no_template(b3: Any) -> None:
    edits = b3.plugins().container_edits(B3, pod(), 1, placed((b3.npus[5].uuid, 65536, 0), (b3.npus[2].uuid, 65536, 0)))
    assert dict(edits.env) == {"ASCEND_VISIBLE_DEVICES": "15,12"}


def test_the_scheduler_s_runtime_annotation_names_a_template_configured_away_since(b3: Any) -> None:
    u = b3.npus[0].uuid
    annotations = {"huawei.com/Ascend910B3": f'[{{"UUID":"{u}","temp":"vir04_custom"}}]'}
    edits = b3.plugins().container_edits(B3, pod(annotations), 1, placed((u, 12000, 0)))
    assert edits.env["ASCEND_VNPU_SPECS"] == "vir04_custom"


def test_a_soft_split_container_gets_the_library_its_limits_and_its_accounting_directory(
    b3: Any, tmp_path: Path
) -> None:
    plugins = b3.plugins(hookPath=str(tmp_path / "hook"), libvnpuLogLevel="2")
    library = IsolationLibrary(
        path="/var/lib/hami/ascend/libvnpu.so", preload_path="/var/lib/hami/ascend/ld.so.preload"
    )
    devices = placed((b3.npus[1].uuid, 28672, 40), (b3.npus[2].uuid, 28672, 40))
    edits = plugins.container_edits(B3, pod(SOFT), 2, devices, library)
    directory = tmp_path / "hook" / "containers" / "uid-1234_eval"
    grants = tmp_path / "hook" / "grants" / "uid-1234_eval"
    assert dict(edits.env) == {
        "ASCEND_VISIBLE_DEVICES": "11,12",
        "ASCEND_DEVICE_MEMORY_LIMIT_0": "28672m",
        "ASCEND_DEVICE_MEMORY_LIMIT_1": "28672m",
        "ASCEND_DEVICE_CORE_LIMIT_0": "40",
        "ASCEND_DEVICE_CORE_LIMIT_1": "40",
        "ASCEND_DEVICE_MEMORY_SHARED_CACHE": "/hami-vnpu-shmem/vnpu.cache",
        "ASCEND_DEVICE_UUIDS": f"{b3.npus[1].uuid},{b3.npus[2].uuid}",
        "LIBVNPU_LOG_LEVEL": "2",
    }
    assert edits.mounts == (
        *(Mount(container_path=p, host_path=p) for p in HAMI_DRIVER_MOUNTS),
        Mount(container_path=library.path, host_path=library.path),
        Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path),
        Mount(container_path="/hami-vnpu-shmem", host_path=str(directory), read_only=False),
        Mount(container_path="/etc/hami/grant", host_path=str(grants)),
    )
    assert edits.accounting_file == str(directory / "vnpu.cache")
    assert edits.files[str(grants / "ascend.control")] == "\0" * 256
    assert {k: v for k, v in edits.files.items() if k.endswith(".grant")} == {
        str(grants / "ascend.grant"): "hami-grant 1\npolicy default\npriority 1\noversubscribe 0\n"
        f"device 0 {28672 << 20} 40 {b3.npus[1].uuid}\ndevice 1 {28672 << 20} 40 {b3.npus[2].uuid}\nend\n"
    }


def test_an_operator_managed_library_directory_wins_and_without_any_the_hook_path_is_used(b3: Any) -> None:
    devices = placed((b3.npus[0].uuid, 16384, 30))
    library = IsolationLibrary(path="/installed/libvnpu.so", preload_path="/installed/ld.so.preload")
    managed = b3.plugins(libraryDir="/opt/vnpu").container_edits(B3, pod(SOFT), 1, devices, library)
    fallback = b3.plugins().container_edits(B3, pod(SOFT), 1, devices, None)
    assert [m for m in managed.mounts if "vnpu.so" in m.host_path or "preload" in m.container_path] == [
        Mount(container_path="/opt/vnpu/libvnpu.so", host_path="/opt/vnpu/libvnpu.so"),
        Mount(container_path="/etc/ld.so.preload", host_path="/opt/vnpu/ld.so.preload"),
    ]
    assert Mount(container_path="/etc/ld.so.preload", host_path="/usr/local/hami-vnpu-core/ld.so.preload") in (
        fallback.mounts
    )


def test_disabling_the_core_limit_and_the_driver_mounts_are_configurable(b3: Any) -> None:
    plugins = b3.plugins(disableCoreLimit=True, driverMounts=["/usr/local/Ascend/driver"])
    edits = plugins.container_edits(B3, pod(SOFT), 1, placed((b3.npus[0].uuid, 16384, 30)))
    assert edits.env["ASCEND_CORE_UTILIZATION_POLICY"] == "disable"
    assert edits.mounts[0] == Mount(container_path="/usr/local/Ascend/driver", host_path="/usr/local/Ascend/driver")


def test_a_device_not_on_this_node_is_refused_naming_it(b3: Any) -> None:
    with pytest.raises(HamiError, match="Ascend device NOT-HERE is not on this node"):
        b3.plugins().container_edits(B3, pod(), 1, placed(("NOT-HERE", 16384, 0)))


def test_a_container_without_devices_gets_nothing(b3: Any) -> None:
    assert b3.plugins().container_edits(B3, pod(SOFT), 0, ()).env == {}


def test_soft_split_allocation_prepares_and_release_removes_the_accounting_directories(b3: Any, tmp_path: Path) -> None:
    plugins = b3.plugins(hookPath=str(tmp_path / "hook"))
    devices = placed((b3.npus[0].uuid, 16384, 30))
    directory = tmp_path / "hook" / "containers" / "uid-1234_train"
    directory.mkdir(parents=True)
    (directory / "stale.cache").write_text("from a container that ran before")
    assert plugins.allocate(B3, pod(SOFT), 1, devices).devices == devices
    assert directory.is_dir()
    assert not any(directory.iterdir())
    assert stat.S_IMODE(directory.stat().st_mode) == 0o777
    plugins.release(B3, pod(SOFT), [(), devices, ()])
    assert not directory.exists()
    plugins.release(B3, pod(SOFT), [(), devices, ()])  # again: nothing left, nothing fails


def test_template_mode_allocation_prepares_nothing(b3: Any, tmp_path: Path) -> None:
    plugins = b3.plugins(hookPath=str(tmp_path / "hook"))
    plugins.allocate(B3, pod(), 1, placed((b3.npus[0].uuid, 16384, 0)))
    assert not (tmp_path / "hook").exists()
