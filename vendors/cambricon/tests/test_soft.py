"""The soft mode (``mluMode: hami-core``) on the node: no sMLU is made, the container gets its cards whole plus
libvmlu.so, its accounting directory, its limits and the node's grant; what the tenant controls cannot raise them."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from hami.errors import ConfigError, HamiError
from hami.model import ContainerDevice, IsolationLibrary, Pod
from hami.plugins import VendorPlugins
from hami_vendor_cambricon.cndev import Cndev

MachineHost = Callable[..., VendorPlugins]
UUIDS = [f"MLU-a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(4)]
UID = "0a1b2c3d-0000-4000-8000-000000000001"
LIBRARY = IsolationLibrary(
    path="/var/lib/hami/cambricon/libvmlu.so", preload_path="/var/lib/hami/cambricon/ld.so.preload"
)


def pod(uid: str = UID, annotations: dict[str, str] | None = None) -> Pod:
    return Pod.model_validate(
        {"name": "p", "namespace": "ns", "uid": uid, "annotations": annotations or {}, "containers": [{"name": "c"}]}
    )


def share(card: int = 1, memory: int = 4096, cores: int = 25) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=UUIDS[card], type="MLU", usedmem=memory, usedcores=cores),)


@pytest.fixture
def soft_node(mlu_node: MachineHost, tmp_path: Path) -> VendorPlugins:
    return mlu_node(mluMode="hami-core", hookPath=str(tmp_path / "hook"))


def test_a_share_gets_no_smlu_but_its_accounting_directory(soft_node: VendorPlugins, tmp_path: Path) -> None:
    allocation = soft_node.allocate("MLU", pod(), 0, share())
    assert "CAMBRICON_DSMLU_PROFILE_INSTANCE" not in allocation.pod_annotations
    assert allocation.node_annotations == {"cambricon.com/dsmlu.lock": None}
    assert Cndev.open(soft_node.vendor("cambricon").settings.cndev_library).instances(1) == []
    directory = tmp_path / "hook" / "containers" / f"{UID}_c"
    assert directory.is_dir()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o777  # the container's user, whoever, writes its file there


def test_the_container_gets_its_cards_whole_the_library_its_limits_and_the_grant(
    soft_node: VendorPlugins, tmp_path: Path
) -> None:
    edits = soft_node.container_edits("MLU", pod(), 0, share(), LIBRARY)
    assert edits.env == {
        "CAMBRICON_VISIBLE_DEVICES": "1",
        "CAMBRICON_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CAMBRICON_DEVICE_CORE_LIMIT_0": "25",
        "CAMBRICON_DEVICE_MEMORY_SHARED_CACHE": "/hami-vmlu-shmem/vmlu.cache",
        "CAMBRICON_DEVICE_UUIDS": UUIDS[1],
    }
    assert [d.host_path for d in edits.devices] == ["/dev/cambricon_dev1", "/dev/cambricon_ctl"]
    mounts = {m.container_path: (m.host_path, m.read_only) for m in edits.mounts}
    hook = tmp_path / "hook"
    assert mounts == {
        LIBRARY.path: (LIBRARY.path, True),
        "/etc/ld.so.preload": (LIBRARY.preload_path, True),
        "/hami-vmlu-shmem": (str(hook / "containers" / f"{UID}_c"), False),
        "/etc/hami/grant": (str(hook / "grants" / f"{UID}_c"), True),
    }
    assert edits.accounting_file == str(hook / "containers" / f"{UID}_c" / "vmlu.cache")
    grant = edits.files[str(hook / "grants" / f"{UID}_c" / "cambricon.grant")]
    assert f"device 0 {4096 << 20} 25 {UUIDS[1]}\n" in grant


def test_what_the_tenant_writes_changes_no_limit(soft_node: VendorPlugins) -> None:
    # the tenant patches its profile (a whole other card) and would set the library's variables in its image; the
    # grant comes from the placement and the library reads it first (the environment may only lower a limit)
    tenant = pod(annotations={"CAMBRICON_DSMLU_PROFILE": "3_100_96"})
    edits = soft_node.container_edits("MLU", tenant, 0, share(memory=1024, cores=10), LIBRARY)
    (grant,) = (text for path, text in edits.files.items() if path.endswith("cambricon.grant"))
    assert f"device 0 {1024 << 20} 10 {UUIDS[1]}\n" in grant
    assert "/dev/cambricon_dev3" not in {d.host_path for d in edits.devices}
    assert next(m for m in edits.mounts if m.container_path == "/etc/hami/grant").read_only


def test_whole_cards_get_no_compute_limit(soft_node: VendorPlugins) -> None:
    whole = (ContainerDevice(uuid=UUIDS[0], type="MLU", usedmem=24576, usedcores=100),
             ContainerDevice(uuid=UUIDS[2], type="MLU", usedmem=24576, usedcores=100))  # fmt: skip
    env = soft_node.container_edits("MLU", pod(), 0, whole, LIBRARY).env
    assert (env["CAMBRICON_VISIBLE_DEVICES"], env["CAMBRICON_DEVICE_CORE_LIMIT_0"]) == ("0,2", "0")
    assert env["CAMBRICON_DEVICE_MEMORY_LIMIT_1"] == "24576m"


def test_release_removes_the_pods_directories_and_a_hostile_uid_reaches_nothing(
    soft_node: VendorPlugins, tmp_path: Path
) -> None:
    soft_node.allocate("MLU", pod(), 0, share())
    other = pod(uid="0a1b2c3d-0000-4000-8000-000000000002")
    soft_node.allocate("MLU", other, 0, share())
    soft_node.release("MLU", pod(), [share()])
    left = sorted(p.name for p in (tmp_path / "hook" / "containers").iterdir())
    assert left == [f"{other.uid}_c"]
    for hostile in ("../../x", "*", ".."):
        with pytest.raises(HamiError, match="pod ns/p"):
            soft_node.allocate("MLU", pod(uid=hostile), 0, share())
        soft_node.release("MLU", pod(uid=hostile), [share()])
    assert sorted(p.name for p in (tmp_path / "hook" / "containers").iterdir()) == [f"{other.uid}_c"]


def test_without_a_library_the_edits_say_what_to_install(soft_node: VendorPlugins, mlu_node: MachineHost) -> None:
    with pytest.raises(HamiError, match=r"the soft mode needs libvmlu\.so.*cambricon\.libraryDir is not set"):
        soft_node.container_edits("MLU", pod(), 0, share(), None)
    chosen = mlu_node(mluMode="hami-core", libraryDir="/opt/vmlu")
    mounts = {m.container_path: m.host_path for m in chosen.container_edits("MLU", pod(), 0, share(), None).mounts}
    assert mounts["/etc/ld.so.preload"] == "/opt/vmlu/ld.so.preload"
    assert mounts["/opt/vmlu/libvmlu.so"] == "/opt/vmlu/libvmlu.so"


def test_the_mode_is_validated(mlu_node: MachineHost) -> None:
    with pytest.raises(ConfigError, match="mluMode"):
        mlu_node(mluMode="smlu")
