"""The Moore Threads plugin's DRM source (`hami_drm_usage_source`), off by default: MTML has no per-process memory,
and whether the mtgpu kernel driver publishes the kernel's per-client statistics is not documented (its public
source registers no ``show_fdinfo``). Turned on, with the region an operator read from the driver's own fdinfo on
the hardware, the node daemon's backstop reads the containers' memory from it; the fdinfo below is in the format
of Linux's Documentation/gpu/drm-usage-stats.rst, with ``drm-driver`` the name the driver registers (``mtgpu``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hami.cluster.memory import MemoryCluster
from hami.model import ContainerDevice, DrmUsageSource
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.testing.drmfdinfo import FakeProc, fdinfo_text

POD = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
MiB = 1 << 20


def served(uuid: str, mib: int) -> ServedContainer:
    device = ContainerDevice(uuid=uuid, type="Mthreads-MTT-S4000", usedmem=mib, usedcores=4)
    return ServedContainer("team", "trainer", POD, "main", 0, "Mthreads", (device,))


def test_by_default_there_is_no_source_and_the_backstop_reads_nothing(
    fakes: Any, mthreads_node: Any, tmp_path: Path
) -> None:
    gpus = fakes.s4000_server(2)
    plugins = mthreads_node(gpus).plugins()
    plugins.discover()
    assert plugins.drm_usage_source("Mthreads") is None
    proc = FakeProc(tmp_path / "proc")
    proc.process(4242, POD)
    proc.drm(4242, 7, fdinfo_text("mtgpu", gpus[0].bdf, 3, memory={"resident-local": "40960 MiB"}))
    backstop = Backstop(
        plugins, MemoryCluster(), lambda: [served(gpus[0].uuid, 1024)], BackstopSettings(proc_root=proc.root),
        kill=lambda pid: None,
    )  # fmt: skip
    assert backstop.check() == []
    assert backstop.drm.clients == 0


def test_turned_on_the_backstop_judges_a_container_by_its_mtgpu_clients(
    fakes: Any, mthreads_node: Any, tmp_path: Path
) -> None:
    gpus = fakes.s4000_server(2)
    plugins = mthreads_node(gpus).plugins(drmFdinfo={"enabled": True, "memoryRegions": ["local"]})
    plugins.discover()
    assert plugins.drm_usage_source("Mthreads") == DrmUsageSource(
        drivers=("mtgpu",), devices={g.bdf: g.uuid for g in gpus}, memory_regions=("local",)
    )
    proc = FakeProc(tmp_path / "proc")
    proc.process(4242, POD)
    proc.drm(4242, 7, fdinfo_text("mtgpu", gpus[1].bdf, 3, memory={"resident-local": "2048 MiB"}))
    proc.drm(4242, 9, fdinfo_text("mtgpu", gpus[1].bdf, 3, memory={"resident-local": "2048 MiB"}))  # dup'd
    killed: list[int] = []
    backstop = Backstop(
        plugins, MemoryCluster(), lambda: [served(gpus[1].uuid, 1536)], BackstopSettings(proc_root=proc.root),
        kill=killed.append,
    )  # fmt: skip
    (overrun,) = backstop.check()
    assert (overrun.used_bytes, overrun.limit_bytes) == (2048 * MiB, 1536 * MiB)
    assert killed == [4242]
