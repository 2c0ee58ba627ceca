"""The ``hami-core`` sharing mode: a Moore Threads container gets the isolation library ``libvmusa.so``, its
accounting directory, its limits in MUSA_* variables and the node's grant, which a tenant cannot rewrite; the
directories are made at Allocate and removed at release."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from hami.errors import HamiError
from hami.isolation import grant
from hami.model import ContainerDevice, IsolationLibrary, Pod
from hami_vendor_mthreads import plugin
from hami_vendor_mthreads.edits import percent

MT = "Mthreads"
F = Any


def pod(uid: str = "0f1e2d3c-aaaa-bbbb-cccc-000000000001") -> Pod:
    from hami.model import Container

    return Pod(name="p", namespace="ml", uid=uid, containers=(Container(name="musa"),))


def share(gpu: Any, memory: int = 8192, cores: int = 4) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=gpu.uuid, type=MT, usedmem=memory, usedcores=cores),)


def test_the_plugin_names_its_isolation_library() -> None:
    assert plugin.INFO.isolation_library == "libvmusa.so"


@pytest.mark.parametrize(("cores", "expected"), [(4, 25), (8, 50), (1, 6), (15, 93), (16, 0), (0, 0)])
def test_cores_in_sixteenths_become_percent_of_device_time(cores: int, expected: int) -> None:
    assert percent(cores) == expected


def test_soft_mode_edits(fakes: F, mthreads_node: Any, tmp_path: Path) -> None:
    gpus = fakes.s4000_server(2)
    node = mthreads_node(gpus)
    hook = tmp_path / "hook"
    plugins = node.plugins(sharingMode="hami-core", hookPath=str(hook), libvmusaLogLevel="2")
    library = IsolationLibrary(path="/var/lib/hami/mthreads/libvmusa.so", preload_path="/var/lib/hami/mthreads/preload")
    the_pod = pod()
    plugins.allocate(MT, the_pod, 0, share(gpus[1]))
    edits = plugins.container_edits(MT, the_pod, 0, share(gpus[1]), library=library)
    env = dict(edits.env)
    assert env["MTHREADS_VISIBLE_DEVICES"] == "1"
    assert (env["MUSA_DEVICE_MEMORY_LIMIT_0"], env["MUSA_DEVICE_SM_LIMIT_0"]) == ("8192m", "25")
    assert env["MUSA_DEVICE_UUIDS"] == gpus[1].uuid
    assert env["MUSA_DEVICE_MEMORY_SHARED_CACHE"] == "/hami-vmusa-shmem/vmusa.cache"
    assert env["LIBVMUSA_LOG_LEVEL"] == "2"
    accounting = hook / "containers" / f"{the_pod.uid}_musa"
    mounts = {m.container_path: (m.host_path, m.read_only) for m in edits.mounts}
    assert mounts[library.path] == (library.path, True)
    assert mounts["/etc/ld.so.preload"] == (library.preload_path, True)
    assert mounts["/hami-vmusa-shmem"] == (str(accounting), False)
    grants = hook / "grants" / f"{the_pod.uid}_musa"
    assert mounts[grant.GRANT_DIR] == (str(grants), True)  # the tenant cannot rewrite its limits
    assert edits.accounting_file == str(accounting / "vmusa.cache")
    text = edits.files[str(grants / "mthreads.grant")]
    (device,) = grant.parse(text).devices
    assert (device.memory_bytes, device.cores, device.uuid) == (8192 << 20, 25, gpus[1].uuid)
    # Allocate made the accounting directory, writable by whatever user the container runs as
    assert stat.S_IMODE(accounting.stat().st_mode) == 0o777
    (accounting / "vmusa.cache").write_text("x")
    plugins.release(MT, the_pod, [share(gpus[1])])
    assert not accounting.exists()


def test_library_dir_is_used_without_an_installed_library(fakes: F, mthreads_node: Any, tmp_path: Path) -> None:
    gpus = fakes.s4000_server(1)
    plugins = mthreads_node(gpus).plugins(sharingMode="hami-core", hookPath=str(tmp_path), libraryDir="/opt/hami/lib")
    edits = plugins.container_edits(MT, pod(), 0, share(gpus[0]))
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    assert mounts["/opt/hami/lib/libvmusa.so"] == "/opt/hami/lib/libvmusa.so"
    assert mounts["/etc/ld.so.preload"] == "/opt/hami/lib/ld.so.preload"


def test_sgpu_mode_adds_nothing_of_the_library(fakes: F, mthreads_node: Any, tmp_path: Path) -> None:
    gpus = fakes.s4000_server(1)
    plugins = mthreads_node(gpus).plugins(hookPath=str(tmp_path))
    plugins.allocate(MT, pod(), 0, share(gpus[0]))
    edits = plugins.container_edits(MT, pod(), 0, share(gpus[0]))
    assert not edits.mounts
    assert not edits.files
    assert not any(k.startswith("MUSA_DEVICE") for k in edits.env)
    assert not (tmp_path / "containers").exists()


def test_a_hostile_pod_uid_cannot_name_a_host_path(fakes: F, mthreads_node: Any, tmp_path: Path) -> None:
    gpus = fakes.s4000_server(1)
    plugins = mthreads_node(gpus).plugins(sharingMode="hami-core", hookPath=str(tmp_path / "hook"))
    (tmp_path / "victim").mkdir()
    hostile = pod(uid="../../victim")
    with pytest.raises(HamiError, match="cannot name a host path"):
        plugins.allocate(MT, hostile, 0, share(gpus[0]))
    with pytest.raises(HamiError, match="cannot name a host path"):
        plugins.container_edits(MT, hostile, 0, share(gpus[0]))
    plugins.release(MT, hostile, [share(gpus[0])])
    assert (tmp_path / "victim").exists()
