"""Fixtures for the Hygon tests: fake DTK management libraries built from C, a fake ``hy-smi``, and the machines
they pretend to be.

`fake_dtk` compiles ``fake_dtk/fake_dtk.c`` once per session into a fake ``librocm_smi64.so`` (``-DFAKE_RSMI``)
and ``libhydmi.so`` (``-DFAKE_DMI``); the plugin is pointed at them through ``rocmSmiLibrary`` and ``dmiLibrary``,
so the binding loads and calls them exactly as the real ones. `hygon_node` writes a machine (a list of `Dcu`)
where the fakes read it (``FAKE_DTK_CONFIG``; the virtual devices in ``FAKE_DTK_STATE``), as ``hy-smi`` would
print it (ROCm SMI's ``DCU[i] : field: value`` lines), and as sysfs shows each DCU's DRM nodes; and builds
`VendorPlugins` reading it from either source.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_hygon.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_dtk" / "fake_dtk.c"
GIB = 1024**3


@dataclass(frozen=True)
class FakeDtk:
    rsmi: Path
    dmi: Path
    rsmi_old: Path
    """A ROCm SMI without ``rsmi_compute_process_info_by_device_get``, as older libraries are."""


@pytest.fixture(scope="session")
def fake_dtk(tmp_path_factory: pytest.TempPathFactory) -> FakeDtk:
    try:
        cc = find_compiler()
    except NoCompilerError as exc:
        pytest.fail(f"the Hygon tests build fake DTK libraries in C: {exc}")
    out = tmp_path_factory.mktemp("fake-dtk")
    built = {}
    variants = (("rsmi", "librocm_smi64.so", ["-DFAKE_RSMI"]), ("dmi", "libhydmi.so", ["-DFAKE_DMI"]),
                ("rsmi_old", "old/librocm_smi64.so", ["-DFAKE_RSMI", "-DFAKE_RSMI_NO_BY_DEVICE"]))  # fmt: skip
    for variant, name, defines in variants:
        target = out / name
        target.parent.mkdir(exist_ok=True)
        cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
               f"-I{CSRC}", *defines, "-o", str(target), str(SOURCE)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            pytest.fail(f"building the fake {name} failed:\n{' '.join(cmd)}\n{done.stderr}")
        built[variant] = target
    return FakeDtk(**built)


@dataclass(frozen=True)
class Dcu:
    """One DCU of a fake machine."""

    bus: int
    serial: str
    device_id: int = 0x55B7
    total: int = 64 * GIB
    used: int = 0
    cus: int = 60
    numa: int = 0
    card: int = 0

    @property
    def bdf(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    @property
    def uuid(self) -> str:
        return f"DCU-{self.serial}"

    def line(self) -> str:
        return f"0 {self.bus} 0 0 {self.serial} {self.device_id:x} {self.total} {self.used} {self.cus} {self.numa}"


def z100l_server(count: int = 4) -> list[Dcu]:
    """Z100L DCUs (60 CUs, 64 GiB as the fake says), cards 1.. with render nodes 128.."""
    return [Dcu(bus=0x10 + i, serial=f"PD2301{i:04d}", numa=i // 2, card=i + 1) for i in range(count)]


def hy_smi_output(dcus: Sequence[Dcu], prefix: str = "DCU") -> str:
    """What ``hy-smi --showbus --showserial --showid --showmeminfo vram`` prints (ROCm SMI's line form)."""
    rule = "=" * 86
    lines = [f"{'=' * 28} System Management Interface {'=' * 29}", rule]
    for i, d in enumerate(dcus):
        lines.append(f"{prefix}[{i}]\t\t: PCI Bus: {d.bdf.upper()}")
    lines.append(rule)
    for i, d in enumerate(dcus):
        lines.append(f"{prefix}[{i}]\t\t: Serial Number: {d.serial}")
    for i, d in enumerate(dcus):
        lines.append(f"{prefix}[{i}]\t\t: Device ID: 0x{d.device_id:04x}")
    for i, d in enumerate(dcus):
        lines.append(f"{prefix}[{i}]\t\t: VRAM Total Memory (B): {d.total}")
        lines.append(f"{prefix}[{i}]\t\t: VRAM Total Used Memory (B): {d.used}")
    lines += [rule, f"{'=' * 35} End of SMI Log {'=' * 36}"]
    return "\n".join(lines) + "\n"


def write_hy_smi(directory: Path, output: str, exit_code: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "hy-smi.txt"
    text.write_text(output)
    script = directory / "hy-smi"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$*" != "--showbus --showserial --showid --showmeminfo vram" ]; then\n'
        '  echo "bad args: $*" >&2; exit 2\nfi\n'
        f'cat "{text}"\nexit {exit_code}\n'
    )
    script.chmod(0o755)
    return script


@dataclass
class HygonNode:
    """One fake Hygon machine."""

    directory: Path
    dtk: FakeDtk
    dcus: list[Dcu]

    def write(self) -> None:
        (self.directory / "dtk.conf").write_text("".join(d.line() + "\n" for d in self.dcus))
        for d in self.dcus:
            drm = self.directory / "sys" / "bus" / "pci" / "devices" / d.bdf / "drm"
            drm.mkdir(parents=True, exist_ok=True)
            (drm / f"card{d.card}").mkdir(exist_ok=True)
            (drm / f"renderD{127 + d.card}").mkdir(exist_ok=True)
        write_hy_smi(self.directory / "bin", hy_smi_output(self.dcus))

    @property
    def state_file(self) -> Path:
        return self.directory / "vdevs.state"

    def vdevs(self) -> list[tuple[int, int, int, int]]:
        """The driver's virtual devices: (id, device, CUs, MiB)."""
        if not self.state_file.exists():
            return []
        rows = [tuple(int(x) for x in line.split()) for line in self.state_file.read_text().splitlines() if line]
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def config(self, source: str = "rsmi", **extra: Any) -> dict[str, Any]:
        missing = str(self.directory / "absent.so")
        return {
            "rocmSmiLibrary": str(self.dtk.rsmi) if source == "rsmi" else missing,
            "dmiLibrary": str(self.dtk.dmi) if source in ("rsmi", "hy-smi+dmi") else missing,
            "hySmi": str(self.directory / "bin" / "hy-smi"),
            "vdevDir": str(self.directory / "vgpu" / "dcu"),
            "exporterDir": str(self.directory / "etc-vdev"),
            "sysfsRoot": str(self.directory / "sys"),
            "hookPath": str(self.directory / "hami-core"),
            "hygonDriverPath": "/opt/hygondriver-host",
            **extra,
        }

    def plugins(self, source: str = "rsmi", **extra: Any) -> VendorPlugins:
        return VendorPlugins.from_plugins({"hygon": plugin}, config={"hygon": self.config(source, **extra)})


@pytest.fixture
def hygon_node(
    tmp_path: Path, fake_dtk: FakeDtk, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[Dcu]], HygonNode]]:
    def make(dcus: list[Dcu]) -> HygonNode:
        node = HygonNode(tmp_path / "node", fake_dtk, dcus)
        node.directory.mkdir(exist_ok=True)
        node.write()
        monkeypatch.setenv("FAKE_DTK_CONFIG", str(node.directory / "dtk.conf"))
        monkeypatch.setenv("FAKE_DTK_STATE", str(node.state_file))
        return node

    monkeypatch.delenv("FAKE_DTK_FAIL", raising=False)
    yield make
    os.environ.pop("FAKE_DTK_FAIL", None)


class Fakes:
    """The helpers above, for the test modules (which cannot import this file)."""

    Dcu = Dcu
    GIB = GIB
    z100l_server = staticmethod(z100l_server)
    hy_smi_output = staticmethod(hy_smi_output)
    write_hy_smi = staticmethod(write_hy_smi)


@pytest.fixture
def fakes() -> type[Fakes]:
    return Fakes
