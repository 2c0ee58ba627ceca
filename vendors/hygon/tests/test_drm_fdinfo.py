"""The Hygon plugin's DRM source (`hami_drm_usage_source`), off by default: the DCU driver is amdgpu-derived, but
neither its fdinfo keys nor the name it registers with DRM are documented. Turned on with the ``drm-driver`` an
operator read on the hardware, its memory backstops DCUs read from ``hy-smi`` (no ROCm SMI, no per-process figure);
where ROCm SMI answers, its figure stays the judge. The fdinfo below is in the format of Linux's
Documentation/gpu/drm-usage-stats.rst."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hami.cluster.memory import MemoryCluster
from hami.model import ContainerDevice
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.testing.drmfdinfo import FakeProc, fdinfo_text

POD = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
MiB = 1 << 20
ON = {"enabled": True, "drivers": ["hydcu"], "memoryRegions": ["vram"]}


def test_off_by_default_and_without_a_driver_name(hygon_node: Any, fakes: Any) -> None:
    node = hygon_node(fakes.z100l_server(2))
    for plugins in (node.plugins(), node.plugins(drmFdinfo={"enabled": True, "memoryRegions": ["vram"]})):
        plugins.discover()
        assert plugins.drm_usage_source("DCU") is None


def test_on_a_node_read_from_hy_smi_a_container_over_its_grant_by_fdinfo_is_killed(
    hygon_node: Any, fakes: Any, tmp_path: Path
) -> None:
    node = hygon_node(fakes.z100l_server(2))
    plugins = node.plugins("hy-smi", drmFdinfo=ON)
    plugins.discover()
    assert plugins.device_processes("DCU") is None
    source = plugins.drm_usage_source("DCU")
    assert source is not None
    assert dict(source.devices) == {d.bdf: d.uuid for d in node.dcus}
    proc = FakeProc(tmp_path / "proc")
    proc.process(4242, POD)
    proc.drm(4242, 7, fdinfo_text("hydcu", node.dcus[0].bdf, 5, memory={"resident-vram": "6144 MiB"}))
    device = ContainerDevice(uuid=node.dcus[0].uuid, type="DCU", usedmem=4096, usedcores=25)
    container = ServedContainer("team", "trainer", POD, "main", 0, "DCU", (device,))
    killed: list[int] = []
    backstop = Backstop(
        plugins, MemoryCluster(), lambda: [container], BackstopSettings(proc_root=proc.root), kill=killed.append
    )
    (overrun,) = backstop.check()
    assert (overrun.used_bytes, overrun.limit_bytes) == (6144 * MiB, 4096 * MiB)
    assert killed == [4242]
