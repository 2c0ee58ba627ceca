"""Fixtures for the Ascend vendor's tests: a fake DCMI built from C, a fake ``npu-smi``, and the machines they
pretend to be.

`fake_dcmi` compiles ``fake_dcmi/fake_dcmi.c`` once per session with the system C compiler into a temporary
``libdcmi.so`` (and, with ``-DOLD_DRIVER``, the variant with the older function names). The plugin is pointed at it
through the ``dcmiLibrary`` setting, so the driver binding loads and calls it exactly as it would the real one. A
test describes a machine as a list of `Npu` (`Machines`: an eight-NPU 910B3 server, a 310P3 card, a 910C super-pod
node) and `ascend_node` writes it where the fake reads it (``FAKE_DCMI_CONFIG``) and as ``npu-smi info`` would
print it (the documented table, two rows per chip), and builds `VendorPlugins` configured for either source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_ascend.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC

SOURCE = Path(__file__).parent / "fake_dcmi" / "fake_dcmi.c"


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


@dataclass(frozen=True)
class FakeDcmi:
    """The fake libdcmi.so builds: the current driver's names and the older ones."""

    current: Path
    old: Path


@pytest.fixture(scope="session")
def fake_dcmi(tmp_path_factory: pytest.TempPathFactory) -> FakeDcmi:
    cc = _compiler()
    if cc is None:
        pytest.skip("the Ascend tests build a fake DCMI in C and need a C compiler (set CC or install gcc)")
    out = tmp_path_factory.mktemp("fake-dcmi")
    built = {}
    for variant, flags in (("current", []), ("old", ["-DOLD_DRIVER"])):
        target = out / variant / "libdcmi.so"
        target.parent.mkdir()
        cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
               f"-I{CSRC}", *flags, "-o", str(target), str(SOURCE)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            pytest.fail(f"building the fake DCMI failed:\n{' '.join(cmd)}\n{done.stderr}")
        built[variant] = target
    return FakeDcmi(**built)


# --------------------------------------------------------------------------------------------------------
# Machines
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Npu:
    """One NPU of a fake machine, as DCMI and npu-smi describe it."""

    card: int
    device: int
    logic: int
    phy: int
    name: str
    aicore: int
    memory_mib: int
    die: tuple[int, int, int, int, int]
    health: int = 0
    hbm: bool = True
    bus: str = ""

    @property
    def uuid(self) -> str:
        return "-".join(f"{w:08X}" for w in self.die)

    def line(self) -> str:
        words = " ".join(f"{w:x}" for w in self.die)
        return (f"{self.card} {self.device} {self.logic} {self.phy} {self.name} {self.aicore} {self.health} "
                f"{self.memory_mib} {words} {'hbm' if self.hbm else 'ddr'}")  # fmt: skip


class Machines:
    """The machines the tests use."""

    @staticmethod
    def b3_server(count: int = 8) -> list[Npu]:
        """An Atlas 800T A2 style server: eight 910B3, one per card, 64 GiB HBM each."""
        return [
            Npu(card=i, device=0, logic=i, phy=i, name="910B3", aicore=20, memory_mib=65536,
                die=(0x3B0A0000 + i, 0x11, 0x22, 0x33, 0x44), bus=f"0000:{0xC1 + i:02X}:00.0")
            for i in range(count)
        ]  # fmt: skip

    @staticmethod
    def p310_cards() -> list[Npu]:
        """Two 310P3 cards, DDR memory, NPU ids 6 and 7 with device ids 0 and 1."""
        return [
            Npu(card=6, device=0, logic=0, phy=0, name="310P3", aicore=8, memory_mib=21527, hbm=False,
                die=(0x310F0000, 1, 2, 3, 4), bus="0000:84:00.0"),
            Npu(card=7, device=0, logic=1, phy=1, name="310P3", aicore=8, memory_mib=21527, hbm=False,
                die=(0x310F0001, 1, 2, 3, 4), bus="0000:85:00.0"),
        ]  # fmt: skip

    @staticmethod
    def c_superpod(modules: int = 4) -> list[Npu]:
        """A 910C node: `modules` cards of two dies each (physical ids 0..2n-1), chip name Ascend910."""
        return [
            Npu(card=m, device=d, logic=2 * m + d, phy=2 * m + d, name="Ascend910", aicore=20, memory_mib=65536,
                die=(0x910C0000 + 2 * m + d, 7, 7, 7, 7), bus=f"0000:{0x10 + 2 * m + d:02X}:00.0")
            for m in range(modules)
            for d in range(2)
        ]  # fmt: skip


def npu_smi_info(npus: Sequence[Npu]) -> str:
    """What ``npu-smi info`` prints for `npus` (the documented table: two rows per chip; 310P-style with a Device
    column and no HBM column when the chips have DDR memory)."""
    ddr = any(not n.hbm for n in npus)
    rule = "+" + "-" * 31 + "+" + "-" * 17 + "+" + "-" * 54 + "+"
    double = rule.replace("-", "=")
    lines = [
        "+" + "-" * 104 + "+",
        "| npu-smi 24.1.0                   Version: 24.1.0" + " " * 56 + "|",
        rule,
    ]
    power = "Power(W)     Temp(C)           Hugepages-Usage(page)"
    if ddr:
        lines += [
            f"| NPU     Name                  | Health          | {power} |",
            "| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)" + " " * 25 + "|",
        ]
    else:
        lines += [
            f"| NPU     Name                  | Health          | {power} |",
            "| Chip                          | Bus-Id          | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)"
            + " " * 9
            + "|",
        ]
    lines.append(double)
    for n in npus:
        health = "OK" if n.health == 0 else "Critical"
        lines.append(f"| {n.card:<7} {n.name:<21} | {health:<15} | {'70.0':<12} {'34':<17} {'0    / 0':<22}|")
        if ddr:
            usage = f"{'0':<12} {f'1839 / {n.memory_mib}':<40}"
            lines.append(f"| {n.device:<7} {n.phy:<21} | {n.bus:<15} | {usage}|")
        else:
            usage = f"{'0':<11} {'1197 / 13553':<17} {f'1365 / {n.memory_mib}':<23}"
            lines.append(f"| {n.device:<29} | {n.bus:<15} | {usage}|")
        lines.append(double)
    lines += [
        "| NPU     Chip                  | Process id      | Process name             | Process memory(MB)        |",
        double,
        *(f"| No running processes found in NPU {n.card:<66}|" for n in npus),
        rule,
    ]
    return "\n".join(lines) + "\n"


def write_npu_smi(directory: Path, npus: Sequence[Npu], *, exit_code: int = 0) -> Path:
    """A fake ``npu-smi`` (a shell script) in `directory` printing `npus` for ``npu-smi info``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / "npu-smi-info.txt"
    output.write_text(npu_smi_info(npus))
    script = directory / "npu-smi"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" != "info" ]; then echo "npu-smi: unknown command $1" >&2; exit 2; fi\n'
        f"if [ {exit_code} -ne 0 ]; then echo 'dcmi module initialize failed' >&2; exit {exit_code}; fi\n"
        f'cat "{output}"\n'
    )
    script.chmod(0o755)
    return script


@dataclass
class AscendNode:
    """One fake Ascend machine: its NPUs, the fake DCMI describing them, and a fake npu-smi printing them."""

    npus: list[Npu]
    directory: Path
    dcmi: FakeDcmi
    monkeypatch: pytest.MonkeyPatch
    built: list[VendorPlugins] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.write()

    @property
    def config_file(self) -> Path:
        return self.directory / "machine.txt"

    def write(self) -> None:
        """Describe the current NPUs to the fakes (a running session sees the change at its next read)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("".join(n.line() + "\n" for n in self.npus))
        self.monkeypatch.setenv("FAKE_DCMI_CONFIG", str(self.config_file))
        write_npu_smi(self.directory / "bin", self.npus)

    def set_health(self, index: int, health: int) -> None:
        self.npus[index] = replace(self.npus[index], health=health)
        self.write()

    @property
    def npu_smi(self) -> Path:
        return self.directory / "bin" / "npu-smi"

    def config(self, source: str = "dcmi", **extra: Any) -> dict[str, Any]:
        """An `ascend` configuration section reading this machine from `source` (dcmi, old-dcmi or npu-smi)."""
        libraries = {"dcmi": self.dcmi.current, "old-dcmi": self.dcmi.old, "npu-smi": self.directory / "no-libdcmi.so"}
        return {"dcmiLibrary": str(libraries[source]), "npuSmi": str(self.npu_smi), **extra}

    def plugins(self, source: str = "dcmi", **extra: Any) -> VendorPlugins:
        plugins = VendorPlugins.from_plugins({"ascend": plugin}, config={"ascend": self.config(source, **extra)})
        self.built.append(plugins)
        return plugins


@pytest.fixture
def ascend_node(
    fake_dcmi: FakeDcmi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[Npu]], AscendNode]:
    """Make a fake machine from a list of NPUs (see `Machines`)."""

    def make(npus: list[Npu]) -> AscendNode:
        return AscendNode(list(npus), tmp_path / "machine", fake_dcmi, monkeypatch)

    return make


@pytest.fixture
def machines() -> type[Machines]:
    return Machines


@pytest.fixture
def npu_smi_writer() -> Callable[..., Path]:
    return write_npu_smi


@pytest.fixture
def npu_smi_text() -> Callable[[Sequence[Npu]], str]:
    return npu_smi_info
