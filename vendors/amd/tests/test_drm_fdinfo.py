"""The AMD plugin's DRM source (`hami_drm_usage_source`): amdgpu's per-client statistics, matched to the GPUs AMD SMI
discovered by their PCI address, give the node daemon's backstop the containers' memory, which AMD SMI does not give
per process here."""

from __future__ import annotations

import pytest

from hami.cluster.memory import MemoryCluster
from hami.errors import ConfigError
from hami.model import ContainerDevice, DrmUsageSource
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.testing.drmfdinfo import FakeProc, fdinfo_text

POD = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
MiB = 1 << 20


def test_the_source_names_amdgpu_the_gpus_by_pci_address_and_vram_only(amd, machine):
    a, b = amd.gpu(0), amd.gpu(1)
    plugins = amd.plugins(machine(a, b).config())
    plugins.discover()
    assert plugins.drm_usage_source("AMD") == DrmUsageSource(
        drivers=("amdgpu",), devices={a.bdf: a.uuid, b.bdf: b.uuid}, memory_regions=("vram",), engines=()
    )


def test_the_source_is_off_or_given_engines_as_configured_and_a_misspelled_option_is_refused(amd, machine):
    node = machine(amd.gpu(0))
    off = amd.plugins(node.config(drmFdinfo={"enabled": False}))
    off.discover()
    assert off.drm_usage_source("AMD") is None
    busy = amd.plugins(node.config(drmFdinfo={"enabled": True, "memoryRegions": [], "engines": ["gfx", "compute"]}))
    busy.discover()
    source = busy.drm_usage_source("AMD")
    assert source is not None
    assert (source.memory_regions, source.engines) == ((), ("gfx", "compute"))
    with pytest.raises(ConfigError, match="memoryRegion"):
        amd.plugins(node.config(drmFdinfo={"memoryRegion": ["vram"]}))


def test_a_container_holding_more_vram_than_its_grant_is_killed_by_the_backstop(amd, machine, tmp_path):
    """The ROCm process's render-node client, as amdgpu prints it (resident VRAM, GTT beside it not counted)."""
    a, b = amd.gpu(0), amd.gpu(1)
    plugins = amd.plugins(machine(a, b).config())
    plugins.discover()
    proc = FakeProc(tmp_path / "proc")
    proc.process(4242, POD)
    vram_and_gtt = {"resident-vram": "1536 MiB", "resident-gtt": "8192 MiB"}
    proc.drm(4242, 7, fdinfo_text("amdgpu", a.bdf, 12, memory=vram_and_gtt))
    proc.drm(4242, 8, fdinfo_text("amdgpu", b.bdf, 13, memory={"memory-vram": "524288 KiB"}))  # an older kernel's key
    devices = (
        ContainerDevice(uuid=a.uuid, type="AMD", usedmem=1024, usedcores=0),
        ContainerDevice(uuid=b.uuid, type="AMD", usedmem=1024, usedcores=0),
    )
    container = ServedContainer("team", "trainer", POD, "main", 0, "AMD", devices)
    killed: list[int] = []
    backstop = Backstop(
        plugins, MemoryCluster(), lambda: [container], BackstopSettings(proc_root=proc.root), kill=killed.append
    )
    (overrun,) = backstop.check()
    assert (overrun.device_uuid, overrun.used_bytes, overrun.limit_bytes) == (a.uuid, 1536 * MiB, 1024 * MiB)
    assert killed == [4242]
    assert backstop.used[("team", "trainer", "main", b.uuid)] == 512 * MiB
