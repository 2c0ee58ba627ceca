"""Fixtures for the NVIDIA vendor's tests: a fake NVML built from C, and the machines it pretends to be.

`fake_nvml_library` compiles ``fake_nvml/fake_nvml.c`` once per session with the system C compiler into a
temporary ``libnvidia-ml.so.1`` (SONAME ``libnvidia-ml.so.1``). The plugin is pointed at it through the
``nvmlLibrary`` setting: the driver binding loads that file, and pynvml's own ``CDLL("libnvidia-ml.so.1")``
is then resolved to it by the dynamic loader, exactly as the real driver would be found. A test describes a
machine as a dict (`Boxes`: an 8×H100 NVLink box, a mixed T4/V100 node, a MIG-mode A100 node) and `gpu_node`
writes it where the fake reads it (``FAKE_NVML_CONFIG``), with the sysfs NUMA files discovery reads, and
gives a `GpuNode` to build `VendorPlugins` from and to read back what was asked of the hardware (``FAKE_NVML_LOG``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC

SOURCE = Path(__file__).parent / "fake_nvml" / "fake_nvml.c"


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake ``libnvidia-ml.so.1``, built once per test session."""
    cc = _compiler()
    if cc is None:
        pytest.skip("the NVIDIA tests build a fake NVML in C and need a C compiler (set CC or install gcc)")
    out = tmp_path_factory.mktemp("fake-nvml") / "libnvidia-ml.so.1"
    cmd = [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wl,-soname,libnvidia-ml.so.1", f"-I{CSRC}", "-o", str(out),
           str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"building the fake NVML failed:\n{' '.join(cmd)}\n{done.stderr}")
    return out


# --------------------------------------------------------------------------------------------------------
# Machines
# --------------------------------------------------------------------------------------------------------

A100_PROFILES = [
    {"id": 0, "name": "MIG 1g.5gb", "slices": 1, "instances": 7, "sms": 14, "memory_mib": 4864,
     "placements": [[i, 1] for i in range(7)]},
    {"id": 1, "name": "MIG 2g.10gb", "slices": 2, "instances": 3, "sms": 28, "memory_mib": 9856,
     "placements": [[0, 2], [2, 2], [4, 2]]},
    {"id": 2, "name": "MIG 3g.20gb", "slices": 3, "instances": 2, "sms": 42, "memory_mib": 19968,
     "placements": [[0, 4], [4, 4]]},
    {"id": 3, "name": "MIG 4g.20gb", "slices": 4, "instances": 1, "sms": 56, "memory_mib": 19968,
     "placements": [[0, 4]]},
    {"id": 4, "name": "MIG 7g.40gb", "slices": 7, "instances": 1, "sms": 98, "memory_mib": 40192,
     "placements": [[0, 8]]},
    {"id": 7, "name": "MIG 1g.5gb+me", "slices": 1, "instances": 1, "sms": 14, "memory_mib": 4864,
     "placements": [[i, 1] for i in range(7)]},
    {"id": 9, "name": "MIG 1g.10gb", "slices": 1, "instances": 4, "sms": 14, "memory_mib": 9856,
     "placements": [[0, 2], [2, 2], [4, 2], [6, 2]]},
]  # fmt: skip
"""The GPU instance profiles NVML reports for an A100-SXM4-40GB in MIG mode (ids as NVML numbers them)."""


def gpu_uuid(tag: str, index: int) -> str:
    return f"GPU-{tag}{index:02x}00-1111-2222-3333-4444{index:08x}"


class Boxes:
    """Descriptions of the machines the tests use, in the fake NVML's JSON shape, with their NUMA nodes."""

    @staticmethod
    def h100() -> dict[str, Any]:
        """8×H100 PCIe on two sockets; NVLink bridges pair 0-1 and 4-5 (12 links), 2-3 (6), 6-7 (4).
        GPUs 0-3 are on NUMA node 0, 4-7 on node 1; each pair shares a PCIe switch."""
        buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
        bridge = {0: 12, 1: 12, 2: 6, 3: 6, 4: 12, 5: 12, 6: 4, 7: 4}
        devices = []
        for i, bus in enumerate(buses):
            peer = i ^ 1
            links = [{"remote": f"00000000:{buses[peer].upper()}:00.0"} for _ in range(bridge[i])]
            links += [{"state": 0} for _ in range(12 - bridge[i])]
            devices.append(
                {
                    "uuid": gpu_uuid("h1", i),
                    "name": "NVIDIA H100 PCIe",
                    "memory_mib": 81559,
                    "bus_id": f"00000000:{bus.upper()}:00.0",
                    "nvlinks": links,
                    "numa": i // 4,
                }
            )

        def level(a: int, b: int) -> int:
            if a == b:
                return 0
            if a // 2 == b // 2:
                return 10  # one PCIe switch
            return 40 if a // 4 == b // 4 else 50  # same CPU, across CPUs

        return {
            "driver": "550.54.15",
            "devices": devices,
            "topology": [[level(a, b) for b in range(8)] for a in range(8)],
        }

    @staticmethod
    def mixed() -> dict[str, Any]:
        """Two Tesla T4 on NUMA node 0 and two Tesla V100-SXM2-32GB on node 1, the V100s joined by 2 NVLinks."""
        t4 = [
            {"uuid": gpu_uuid("7a", i), "name": "Tesla T4", "memory_mib": 15360, "bus_id": bus, "numa": 0}
            for i, bus in enumerate(["00000000:3B:00.0", "00000000:5E:00.0"])
        ]
        v100 = []
        for i, (bus, peer) in enumerate(
            [("00000000:86:00.0", "00000000:AF:00.0"), ("00000000:AF:00.0", "00000000:86:00.0")]
        ):
            links = [{"remote": peer}, {"remote": peer}] + [{"state": 0}] * 4
            v100.append(
                {
                    "uuid": gpu_uuid("b1", i),
                    "name": "Tesla V100-SXM2-32GB",
                    "memory_mib": 32768,
                    "bus_id": bus,
                    "nvlinks": links,
                    "numa": 1,
                }
            )
        topology = [[0, 10, 50, 50], [10, 0, 50, 50], [50, 50, 0, 20], [50, 50, 20, 0]]
        return {"devices": t4 + v100, "topology": topology}

    @staticmethod
    def a100_mig() -> dict[str, Any]:
        """Two A100-SXM4-40GB in MIG mode; the second already holds a 1g.5gb instance at slice 6, with a process."""
        devices = []
        for i, bus in enumerate(["00000000:07:00.0", "00000000:0F:00.0"]):
            devices.append(
                {
                    "uuid": gpu_uuid("a1", i),
                    "name": "NVIDIA A100-SXM4-40GB",
                    "memory_mib": 40960,
                    "bus_id": bus,
                    "mig_mode": 1,
                    "mig_profiles": A100_PROFILES,
                    "numa": 0,
                }
            )
        devices[1]["instances"] = [{"profile": 0, "start": 6}]
        devices[1]["processes"] = [{"pid": 4242, "gpu_instance": 1}]
        return {"devices": devices, "topology": [[0, 20], [20, 0]]}


@pytest.fixture
def boxes() -> type[Boxes]:
    return Boxes


# --------------------------------------------------------------------------------------------------------
# A node backed by the fake NVML
# --------------------------------------------------------------------------------------------------------


@dataclass
class GpuNode:
    """One fake machine: where its files are, and the `VendorPlugins` over the NVIDIA plugin configured to use it."""

    root: Path
    library: Path
    box: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    built: list[VendorPlugins] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.root / "nvml.log"

    @property
    def events_path(self) -> Path:
        return self.root / "nvml.events"

    def config(self, **extra: Any) -> dict[str, Any]:
        return {
            "nvmlLibrary": str(self.library),
            "sysfsRoot": str(self.root / "sys"),
            "hookPath": str(self.root / "hook"),
            **self.settings,
            **extra,
        }

    def plugins(self, **extra: Any) -> VendorPlugins:
        """A host with the NVIDIA plugin alone, its settings pointing at this machine."""
        plugins = VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": self.config(**extra)})
        self.built.append(plugins)
        return plugins

    def calls(self) -> list[dict[str, Any]]:
        """What was asked of the hardware (mutations only), in order."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def xid(self, index: int, xid: int) -> None:
        """Make GPU `index` report XID `xid` from now on."""
        with self.events_path.open("a") as f:
            f.write(f"{index} {xid}\n")

    def close(self) -> None:
        for plugins in self.built:
            runtime = plugins.vendor("nvidia").settings.runtime
            if runtime is not None:
                runtime.close()


@pytest.fixture
def gpu_node(
    fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., GpuNode]]:
    """`gpu_node(box, **settings)`: make the fake NVML describe `box` and return the node."""
    made: list[GpuNode] = []

    def make(box: dict[str, Any], **settings: Any) -> GpuNode:
        root = tmp_path / f"node{len(made)}"
        root.mkdir()
        config = root / "nvml.json"
        config.write_text(json.dumps(box))
        for device in box.get("devices", ()):
            if "numa" in device:
                bus = device["bus_id"].lower()[4:]
                numa = root / "sys" / "bus" / "pci" / "devices" / bus / "numa_node"
                numa.parent.mkdir(parents=True, exist_ok=True)
                numa.write_text(f"{device['numa']}\n")
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
        monkeypatch.setenv("FAKE_NVML_LOG", str(root / "nvml.log"))
        monkeypatch.setenv("FAKE_NVML_EVENTS", str(root / "nvml.events"))
        node = GpuNode(root, fake_nvml_library, box, settings)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()
