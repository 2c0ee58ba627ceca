"""Fixtures for the Iluvatar tests: a fake ixML (``libixml.so``) built from C, and the machines it pretends to be.

`fake_ixml` compiles ``fake_ixml/fake_ixml.c`` once per session into a fake ``libixml.so`` and, with
``-DFAKE_NOT_IXML``, into another project's ``libixml.so`` (an XML parser); the plugin is pointed at them through
``ixmlLibrary``, so the binding loads and calls them exactly as CoreX's. `machine` writes a machine (a list of
`Chip`) beside a copy of the fake, where it reads it (``fake_ixml.machine``), and the sysfs NUMA node of each chip;
`iluvatar_plugins` builds the `VendorPlugins` reading it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_iluvatar.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_ixml" / "fake_ixml.c"


def build_fake_ixml(out: Path, *defines: str) -> Path:
    """Compile the fake into `out` (a directory); returns the library."""
    cc = find_compiler()
    out.mkdir(parents=True, exist_ok=True)
    target = out / "libixml.so"
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
           f"-I{CSRC}", *defines, "-o", str(target), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake libixml.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


@dataclass(frozen=True)
class FakeIxml:
    ixml: Path
    not_ixml: Path


@pytest.fixture(scope="session")
def fake_ixml(tmp_path_factory: pytest.TempPathFactory) -> FakeIxml:
    out = tmp_path_factory.mktemp("fake-ixml")
    try:
        return FakeIxml(build_fake_ixml(out / "ixml"), build_fake_ixml(out / "xml", "-DFAKE_NOT_IXML"))
    except NoCompilerError as exc:
        pytest.fail(f"the Iluvatar tests build a fake ixML in C: {exc}")


@dataclass(frozen=True)
class Chip:
    """One CoreX GPU (chip) of a fake machine."""

    uuid: str
    name: str = "Iluvatar BI-V150S"
    minor: int = 0
    memory_mib: int = 32768
    bus: int = 0x8A
    healthy: bool = True
    numa: int = 0
    board: int = 0

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    def line(self) -> str:
        health = "ok" if self.healthy else "lost"
        return f"{self.uuid} {self.minor} {self.memory_mib} {self.bus_id} {self.board} {health} {self.name}"


@dataclass(frozen=True)
class Machine:
    root: Path
    library: Path

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"ixmlLibrary": str(self.library), "sysfsRoot": str(self.root / "sys"),
                "hookPath": str(self.root / "hook"), **extra}  # fmt: skip


def write_machine(root: Path, library: Path, chips: Sequence[Chip]) -> Machine:
    """A copy of the fake ixML in `root` with `chips` beside it, and their sysfs NUMA nodes."""
    root.mkdir(parents=True, exist_ok=True)
    copy = root / "libixml.so"
    shutil.copy(library, copy)
    (root / "fake_ixml.machine").write_text("".join(c.line() + "\n" for c in chips))
    for c in chips:
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:{c.bus:02x}:00.0"
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{c.numa}\n")
    return Machine(root, copy)


@pytest.fixture
def machine(fake_ixml: FakeIxml, tmp_path: Path) -> Callable[..., Machine]:
    count = iter(range(1000))

    def make(*chips: Chip) -> Machine:
        return write_machine(tmp_path / f"machine{next(count)}", fake_ixml.ixml, chips)

    return make


def iluvatar_plugins(config: Mapping[str, Any]) -> VendorPlugins:
    return VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": dict(config)})


@dataclass(frozen=True)
class Kit:
    """What the tests use from here (conftest.py cannot be imported under --import-mode=importlib)."""

    fake: FakeIxml
    Chip: type[Chip]
    plugins: Callable[[Mapping[str, Any]], VendorPlugins]
    write_machine: Callable[[Path, Path, Sequence[Chip]], Machine]


@pytest.fixture
def ix(fake_ixml: FakeIxml) -> Kit:
    return Kit(fake_ixml, Chip, iluvatar_plugins, write_machine)
