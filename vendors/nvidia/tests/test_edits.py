"""Container edits: the env and mounts HAMi v2.10's device plugin gives NVIDIA containers (golden), the
containers that opt out of the isolation library, oversubscription and logging switches, CDI names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.isolation.grant import DeviceGrant, Grant, parse, write_files
from hami.model import Container, ContainerDevice, ContainerEdits, IsolationLibrary, Mount, Pod
from hami.node.hooklib import IsolationLibraries
from hami.plugins import VendorPlugins

UID = "8f0e6a52-3c1d-4e55-9b7a-2d4f6c1e0a93"
GPU_A = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
GPU_B = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
GPU_C = "GPU-2c3d4e5f-0000-1111-2222-333344445555"
CACHE = re.compile(r"^/usr/local/vgpu/[0-9a-f-]{36}\.cache$")


def device(uuid: str, memory: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=memory, usedcores=cores)


def two_container_pod(**sidecar_env: str) -> Pod:
    return Pod(
        name="trainer-0",
        namespace="ml",
        uid=UID,
        init_containers=(Container(name="fetch"),),
        containers=(Container(name="trainer"), Container(name="sidecar", env=sidecar_env)),
    )


def edits_for(pod: Pod, index: int, devices: tuple[ContainerDevice, ...], **settings: object) -> ContainerEdits:
    plugins = VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": settings})
    return plugins.container_edits("NVIDIA", pod, index, devices)


def test_two_container_pod_gets_hamis_env_and_mounts() -> None:
    pod = two_container_pod()
    trainer = edits_for(pod, 1, (device(GPU_A, 3000, 30),))
    sidecar = edits_for(pod, 2, (device(GPU_B, 2500, 25), device(GPU_C, 2500, 25)))

    for edits, visible, limits, sm, name in (
        (trainer, GPU_A, {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m"}, "30", "trainer"),
        (sidecar, f"{GPU_B},{GPU_C}", {"CUDA_DEVICE_MEMORY_LIMIT_0": "2500m", "CUDA_DEVICE_MEMORY_LIMIT_1": "2500m"},
         "25", "sidecar"),
    ):  # fmt: skip
        env = dict(edits.env)
        assert CACHE.match(env.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE"))  # HAMi: <HOOK_PATH>/vgpu/<uuid>.cache
        assert env == {"NVIDIA_VISIBLE_DEVICES": visible, **limits, "CUDA_DEVICE_SM_LIMIT": sm}
        assert edits.mounts == (
            Mount(container_path="/usr/local/vgpu/libvgpu.so", host_path="/usr/local/vgpu/libvgpu.so", read_only=True),
            Mount(container_path="/usr/local/vgpu", host_path=f"/usr/local/vgpu/containers/{UID}_{name}",
                  read_only=False),
            Mount(container_path="/etc/ld.so.preload", host_path="/usr/local/vgpu/ld.so.preload", read_only=True),
            Mount(container_path="/etc/hami/grant", host_path=f"/usr/local/vgpu/grants/{UID}_{name}"),
        )  # fmt: skip
        assert "/tmp/vgpulock" not in [m.container_path for m in edits.mounts]  # world-writable, shared, unused
    assert trainer.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != sidecar.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert trainer.cdi_devices == (f"nvidia.com/gpu={GPU_A}",)
    assert sidecar.cdi_devices == (f"nvidia.com/gpu={GPU_B}", f"nvidia.com/gpu={GPU_C}")


def test_the_same_placement_gives_the_same_edits() -> None:
    pod = two_container_pod()
    assert edits_for(pod, 1, (device(GPU_A, 3000, 30),)) == edits_for(pod, 1, (device(GPU_A, 3000, 30),))


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_a_container_on_whole_gpus_that_disables_control_gets_neither_library_nor_preload(value: str) -> None:
    edits = edits_for(two_container_pod(CUDA_DISABLE_CONTROL=value), 2, (device(GPU_B, 2500, 100),))
    assert [m.container_path for m in edits.mounts] == ["/usr/local/vgpu"]
    assert edits.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2500m"
    assert edits.files == {}


def test_a_shared_gpu_cannot_be_opted_out_of_the_library() -> None:
    """The tenant sets CUDA_DISABLE_CONTROL on a 25 % share (past admission, e.g. a pod admitted before): the
    node gives it the library and its grant all the same."""
    edits = edits_for(two_container_pod(CUDA_DISABLE_CONTROL="true"), 2, (device(GPU_B, 2500, 25),))
    paths = [m.container_path for m in edits.mounts]
    assert "/etc/ld.so.preload" in paths
    assert "/etc/hami/grant" in paths


def test_disable_control_false_keeps_the_library() -> None:
    edits = edits_for(two_container_pod(CUDA_DISABLE_CONTROL="false"), 2, (device(GPU_B, 2500, 25),))
    assert "/etc/ld.so.preload" in [m.container_path for m in edits.mounts]


def test_switches_from_settings_reach_the_environment() -> None:
    pod = two_container_pod()
    edits = edits_for(
        pod, 1, (device(GPU_A, 3000, 30),), deviceMemoryScaling=2, libCudaLogLevel="4", disableCoreLimit=True
    )
    assert edits.env["CUDA_OVERSUBSCRIBE"] == "true"
    assert edits.env["LIBCUDA_LOG_LEVEL"] == "4"
    assert edits.env["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert parse(next(iter(edits.files.values()))) == Grant(
        (DeviceGrant(3000 << 20, 30, GPU_A),), policy="disable", priority=1, oversubscribe=True
    )
    plain = edits_for(pod, 1, (device(GPU_A, 3000, 30),), deviceMemoryScaling=1)
    assert not {"CUDA_OVERSUBSCRIBE", "LIBCUDA_LOG_LEVEL", "GPU_CORE_UTILIZATION_POLICY"} & set(plain.env)


def test_paths_follow_the_hook_path_and_library_directory() -> None:
    edits = edits_for(
        two_container_pod(), 1, (device(GPU_A, 3000, 30),), hookPath="/opt/hami", libraryDir="/var/lib/hami/nvidia"
    )
    assert edits.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/opt/hami/vgpu/")
    assert [(m.container_path, m.host_path) for m in edits.mounts] == [
        ("/opt/hami/vgpu/libvgpu.so", "/var/lib/hami/nvidia/libvgpu.so"),
        ("/opt/hami/vgpu", f"/opt/hami/vgpu/containers/{UID}_trainer"),
        ("/etc/ld.so.preload", "/var/lib/hami/nvidia/ld.so.preload"),
        ("/etc/hami/grant", f"/opt/hami/vgpu/grants/{UID}_trainer"),
    ]


def test_device_list_strategy_chooses_env_cdi_or_both() -> None:
    pod = two_container_pod()
    only_cdi = edits_for(pod, 1, (device(GPU_A, 3000, 30),), deviceListStrategy=["cdi-cri"])
    assert "NVIDIA_VISIBLE_DEVICES" not in only_cdi.env
    assert only_cdi.cdi_devices == (f"nvidia.com/gpu={GPU_A}",)
    only_env = edits_for(pod, 1, (device(GPU_A, 3000, 30),), deviceListStrategy=["envvar"])
    assert only_env.env["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert only_env.cdi_devices == ()


def test_a_container_without_nvidia_devices_gets_nothing() -> None:
    assert edits_for(two_container_pod(), 0, ()) == ContainerEdits()


def test_mig_devices_are_named_by_their_uuid_without_the_library() -> None:
    mig = "MIG-5e4f3a2b-0001-0000-0002-000000002222"
    edits = edits_for(two_container_pod(), 1, (device(mig, 9856, 28),))
    assert dict(edits.env) == {"NVIDIA_VISIBLE_DEVICES": mig}
    assert edits.mounts == ()
    assert edits.cdi_devices == (f"nvidia.com/gpu={mig}",)


# --------------------------------------------------------------------------------------------------------
# The isolation library the node daemon installed
# --------------------------------------------------------------------------------------------------------

INSTALLED = IsolationLibrary(
    path="/usr/local/hami/nvidia/libvgpu.so", preload_path="/usr/local/hami/nvidia/ld.so.preload"
)


def installed_edits(pod: Pod, index: int, devices: tuple[ContainerDevice, ...], **settings: object) -> ContainerEdits:
    plugins = VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": settings})
    return plugins.container_edits("NVIDIA", pod, index, devices, INSTALLED)


def test_the_library_the_daemon_installed_is_mounted_at_its_own_path_with_its_preload_file() -> None:
    edits = installed_edits(two_container_pod(), 1, (device(GPU_A, 3000, 30),))
    assert [(m.container_path, m.host_path, m.read_only) for m in edits.mounts] == [
        (INSTALLED.path, INSTALLED.path, True),  # where the installed preload file says the library is
        ("/usr/local/vgpu", f"/usr/local/vgpu/containers/{UID}_trainer", False),
        ("/etc/ld.so.preload", INSTALLED.preload_path, True),
        ("/etc/hami/grant", f"/usr/local/vgpu/grants/{UID}_trainer", True),
    ]
    assert edits.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/usr/local/vgpu/")


def test_an_installed_library_is_still_left_out_for_containers_that_disable_control_and_for_mig() -> None:
    opted_out = installed_edits(two_container_pod(CUDA_DISABLE_CONTROL="true"), 2, (device(GPU_B, 2500, 100),))
    assert [m.container_path for m in opted_out.mounts] == ["/usr/local/vgpu"]
    mig = installed_edits(two_container_pod(), 1, (device("MIG-5e4f3a2b-0001-0000-0002-000000002222", 9856, 28),))
    assert mig.mounts == ()


def test_a_configured_library_directory_wins_over_the_installed_library() -> None:
    edits = installed_edits(two_container_pod(), 1, (device(GPU_A, 3000, 30),), libraryDir="/opt/hami-core")
    assert [(m.container_path, m.host_path) for m in edits.mounts if m.read_only] == [
        ("/usr/local/vgpu/libvgpu.so", "/opt/hami-core/libvgpu.so"),
        ("/etc/ld.so.preload", "/opt/hami-core/ld.so.preload"),
        ("/etc/hami/grant", f"/usr/local/vgpu/grants/{UID}_trainer"),
    ]


def test_the_preload_file_the_daemon_writes_names_where_the_container_finds_the_library(tmp_path: Path) -> None:
    plugins = VendorPlugins.from_plugins({"nvidia": plugin})
    libraries = IsolationLibraries(tmp_path / "hooks")
    build = tmp_path / "build" / "libvgpu.so"
    build.parent.mkdir()
    build.write_bytes(b"\x7fELF stands in for the library built into the wheel")
    libraries.install(plugins.vendor("nvidia"), source=build)
    edits = plugins.container_edits(
        "NVIDIA", two_container_pod(), 1, (device(GPU_A, 3000, 30),), libraries.for_vendor("nvidia")
    )
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    named = Path(mounts["/etc/ld.so.preload"]).read_text().strip()
    assert mounts[named] == named  # the preload names the library's path inside the container, mounted from there
    assert Path(named).resolve().read_bytes() == build.read_bytes()  # and it is the build the daemon installed
    assert Path(named).resolve().name.startswith("libvgpu-")


@pytest.mark.parametrize(("setting", "counted"), [(None, 0), (300, 300 << 20)])
def test_the_grant_carries_the_configured_context_memory(tmp_path: Path, setting: int | None, counted: int) -> None:
    extra = {} if setting is None else {"contextMemoryMiB": setting}
    edits = edits_for(two_container_pod(), 1, (device(GPU_A, 3000, 30),), hookPath=str(tmp_path), **extra)
    (text,) = [text for path, text in edits.files.items() if path.endswith("nvidia.grant")]
    assert parse(text).context_bytes == counted


def test_the_node_daemon_writes_the_grant_and_removes_it_with_the_pod(tmp_path: Path) -> None:
    pod = two_container_pod()
    edits = edits_for(pod, 1, (device(GPU_A, 3000, 30),), hookPath=str(tmp_path))
    write_files(edits.files)
    grants = tmp_path / "vgpu" / "grants" / f"{UID}_trainer"
    assert parse((grants / "nvidia.grant").read_text()).devices == (DeviceGrant(3000 << 20, 30, GPU_A),)
    plugins = VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": {"hookPath": str(tmp_path)}})
    plugins.release("NVIDIA", pod, [(), (device(GPU_A, 3000, 30),), ()])
    assert not grants.exists()
