"""libvmaca.so over the fake MACA runtime: the rt layer's checks (hami.testing.rt.RtLayerTests) with MACA's names:
exactly its hooks exported, memory to the byte and counted once per API, out of memory without asking the runtime,
the container's view in mcMemGetInfo, the compute share of every kind of launch, the accounting file."""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation import LINKER_DOORS
from hami.testing.rt import RtLayerTests


class TestMaca(RtLayerTests):
    hatch_build = Path(__file__).resolve().parents[2] / "hatch_build.py"
    fake_prefix = "FAKE_MX_"
    uuid = "GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba"


def test_the_hooks_are_macas(build):
    assert {"mcMalloc", "mcFree", "mcMemGetInfo", "mcLaunchKernel", "mcModuleLaunchKernel"} <= build.exports
    assert not {e for e in build.exports - LINKER_DOORS if not e.startswith("mc")}
