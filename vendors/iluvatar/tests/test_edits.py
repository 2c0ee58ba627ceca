"""Allocation and container edits: what a CoreX container gets, in HAMi's gpu-manager mode and in hami-core mode.

The GPUs come from the fake ixML (conftest.py), so device nodes are named by ixML's minor numbers as on a node.
"""

from __future__ import annotations

import pytest

from hami.errors import HamiError
from hami.hostpaths import HostPathError
from hami.isolation.grant import parse, write_files
from hami.model import Container, ContainerDevice, Pod

A = "GPU-1a2b3c4d-0000-4000-8000-00000000000a"
B = "GPU-1a2b3c4d-0000-4000-8000-00000000000b"
POD = Pod(name="p", namespace="ns", uid="uid-1", containers=(Container(name="main"), Container(name="side")))


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type="BI-V150", usedmem=m, usedcores=c) for u, m, c in devices)


@pytest.fixture
def node(ix, machine):
    return machine(ix.Chip(A, minor=0, bus=0x8A), ix.Chip(B, minor=1, bus=0x8B))


def test_gpu_manager_mode_gets_iluvatars_visible_devices_device_nodes_and_corex(ix, node):
    plugins = ix.plugins(node.config())
    placement = placed((A, 8192, 50), (B, 32768, 100))
    plugins.allocate("BI-V150", POD, 0, placement)
    edits = plugins.container_edits("BI-V150", POD, 0, placement)
    assert edits.env == {"IX_VISIBLE_DEVICES": f"{A},{B}", "ILUVATAR_COREX_VISIBLE_DEVICES": f"{A},{B}"}
    assert [(d.container_path, d.host_path) for d in edits.devices] == [
        ("/dev/iluvatar0", "/dev/iluvatar0"),
        ("/dev/iluvatar1", "/dev/iluvatar1"),
        ("/dev/itrctl", "/dev/itrctl"),
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/usr/local/corex/bin", "/usr/local/corex/bin", True),
        ("/usr/local/corex/lib64", "/usr/local/corex/lib64", True),
    ]
    assert not edits.files
    assert not (node.root / "hook" / "containers").exists()  # gpu-manager mode prepares nothing on the host


def test_corex_mounts_follow_corex_path_or_are_left_to_the_toolkit(ix, node):
    placement = placed((B, 1024, 10))
    moved = ix.plugins(node.config(corexPath="/opt/corex")).container_edits("BI-V150", POD, 0, placement)
    assert [m.host_path for m in moved.mounts] == ["/opt/corex/bin", "/opt/corex/lib64"]
    assert ix.plugins(node.config(mountCorex=False)).container_edits("BI-V150", POD, 0, placement).mounts == ()
    assert [d.host_path for d in moved.devices] == ["/dev/iluvatar1", "/dev/itrctl"]


def test_hami_core_mode_gets_libvcorex_its_accounting_directory_and_a_grant(ix, node):
    plugins = ix.plugins(node.config(iluvatarMode="hami-core", libvcorexLogLevel="2"))
    placement = placed((A, 8192, 50))
    plugins.allocate("BI-V150", POD, 1, placement)
    hook = node.root / "hook"
    shmem = hook / "containers" / "uid-1_side"
    assert shmem.is_dir()
    edits = plugins.container_edits("BI-V150", POD, 1, placement)
    assert edits.env == {
        "IX_VISIBLE_DEVICES": A,
        "ILUVATAR_COREX_VISIBLE_DEVICES": A,
        "IX_DEVICE_MEMORY_LIMIT_0": "8192m",
        "IX_DEVICE_SM_LIMIT_0": "50",
        "IX_DEVICE_MEMORY_SHARED_CACHE": "/hami-vcorex-shmem/vcorex.cache",
        "IX_LOG_LEVEL": "2",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        ("/usr/local/corex/bin", "/usr/local/corex/bin", True),
        ("/usr/local/corex/lib64", "/usr/local/corex/lib64", True),
        (f"{hook}/libvcorex.so", f"{hook}/libvcorex.so", True),
        ("/etc/ld.so.preload", f"{hook}/ld.so.preload", True),
        ("/hami-vcorex-shmem", str(shmem), False),
        ("/etc/hami/grant", f"{hook}/grants/uid-1_side", True),
    ]
    assert edits.accounting_file == str(shmem / "vcorex.cache")
    grant_file = f"{hook}/grants/uid-1_side/iluvatar.grant"
    assert set(edits.files) == {grant_file, f"{hook}/grants/uid-1_side/iluvatar.control"}
    grant = parse(edits.files[grant_file])
    assert (grant.devices[0].memory_bytes, grant.devices[0].cores, grant.devices[0].uuid) == (8192 << 20, 50, A)
    write_files(edits.files)
    plugins.release("BI-V150", POD, [placement])
    assert not shmem.exists()
    assert not (hook / "grants" / "uid-1_side").exists()


def test_a_whole_gpu_has_no_compute_limit(ix, node):
    edits = ix.plugins(node.config(iluvatarMode="hami-core")).container_edits(
        "BI-V150", POD, 0, placed((A, 32768, 100))
    )
    assert edits.env["IX_DEVICE_SM_LIMIT_0"] == "0"


def test_a_gpu_that_is_not_this_nodes_is_refused_with_the_ones_it_has(ix, node):
    with pytest.raises(HamiError, match=f"GPU-nope is not on this node \\(it has {A}, {B}\\)"):
        ix.plugins(node.config()).container_edits("BI-V150", POD, 0, placed(("GPU-nope", 1024, 10)))


def test_a_hostile_pod_uid_cannot_reach_outside_the_containers_directory(ix, node):
    """A pod whose UID is `../victim` gets no accounting directory outside `containers/`, and its release deletes
    nothing beside it."""
    plugins = ix.plugins(node.config(iluvatarMode="hami-core"))
    victim = node.root / "hook" / "victim_keep"
    victim.mkdir(parents=True)
    hostile = POD.model_copy(update={"uid": "../victim"})
    with pytest.raises(HostPathError):
        plugins.allocate("BI-V150", hostile, 0, placed((A, 1024, 10)))
    with pytest.raises(HostPathError):
        plugins.container_edits("BI-V150", hostile, 0, placed((A, 1024, 10)))
    plugins.release("BI-V150", hostile, [])
    assert victim.is_dir()


def test_admission_names_the_container_for_the_gpu_manager_and_makes_multi_gpu_cores_whole(ix, node):
    plugins = ix.plugins({})
    one = Container(name="main", limits={"iluvatar.ai/BI-V150-vgpu": "1", "iluvatar.ai/BI-V150.vMem": "16"})
    edit = plugins.admission_defaults("BI-V150", one, Pod(name="p", containers=(one,)))
    assert edit is not None
    assert dict(edit.env) == {"SOL_CONTINER_NAME": "main"}
    assert dict(edit.limits) == {}
    two = Container(name="train", limits={"iluvatar.ai/BI-V150-vgpu": "2"}, env={"SOL_CONTINER_NAME": "x"})
    edit = plugins.admission_defaults("BI-V150", two, Pod(name="p", containers=(two,)))
    assert edit is not None
    assert dict(edit.limits) == {"iluvatar.ai/BI-V150.vCore": "200"}
    assert dict(edit.env) == {}
