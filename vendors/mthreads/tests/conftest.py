"""Fixtures for the Moore Threads tests: a fake ``libmtml.so`` built from C, a fake ``mthreads-gmi``, and the
machines they pretend to be.

`fake_mtml` compiles ``fake_mtml/fake_mtml.c`` once per session; the plugin is pointed at it through
``mtmlLibrary``, so the binding loads and calls it exactly as the real one. `mthreads_node` writes a machine (a
list of `Gpu`) where the fake reads it (``FAKE_MTML_CONFIG``), as ``mthreads-gmi -q`` would print it, and as sysfs
shows each GPU's DRM nodes; and builds `VendorPlugins` reading it from either source.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_mthreads.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_mtml" / "fake_mtml.c"
GIB = 1024**3


@pytest.fixture(scope="session")
def fake_mtml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        cc = find_compiler()
    except NoCompilerError as exc:
        pytest.fail(f"the Moore Threads tests build a fake libmtml.so in C: {exc}")
    target = tmp_path_factory.mktemp("fake-mtml") / "libmtml.so"
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
           f"-I{CSRC}", "-o", str(target), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the fake libmtml.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


@dataclass(frozen=True)
class Gpu:
    """One GPU of a fake machine."""

    bus: int
    uuid: str
    name: str = "MTT S4000"
    total: int = 48 * GIB
    used: int = 0
    cores: int = 8
    numa: int = 0
    mpc: int = 0
    switch: int = 0

    @property
    def sbdf(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"

    @property
    def bdf(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    def line(self) -> str:
        name = self.name.replace(" ", "_") or "-"
        return (f"{self.uuid or '-'} {name} {self.sbdf} {self.total} {self.used} {self.cores} {self.numa} "
                f"{self.mpc} {self.switch}")  # fmt: skip


def s4000_server(count: int = 4) -> list[Gpu]:
    """MTT S4000 GPUs (48 GiB), two per NUMA node and per PCIe switch."""
    return [
        Gpu(bus=0x3A + i, uuid=f"0c8e1a2b-0000-4000-8000-0000000000{i:02x}", numa=i // 2, switch=i // 2)
        for i in range(count)
    ]


def gmi_output(gpus: Sequence[Gpu]) -> str:
    """What ``mthreads-gmi -q`` prints for these GPUs (the layout third-party captures show)."""
    lines = ["", "==============Mthreads GMI Log==============", "Timestamp                 : Tue Dec  1 2026",
             "Driver Version            : 2.7.0", "", f"Attached GPUs             : {len(gpus)}"]  # fmt: skip
    for i, g in enumerate(gpus):
        lines += [
            f"GPU{i}",
            f"    Product Name          : {g.name}",
            f"    GPU UUID              : {g.uuid}",
            "    PCI",
            f"        Bus Id            : {g.sbdf}",
            "    Memory Usage",
            f"        Total             : {g.total // (1024 * 1024)}MiB",
            f"        Used              : {g.used // (1024 * 1024)}MiB",
            "",
        ]
    return "\n".join(lines) + "\n"


def write_gmi(directory: Path, output: str, exit_code: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = directory / "gmi.txt"
    text.write_text(output)
    script = directory / "mthreads-gmi"
    script.write_text(
        f'#!/bin/sh\nif [ "$*" != "-q" ]; then\n  echo "bad args: $*" >&2; exit 2\nfi\ncat "{text}"\nexit {exit_code}\n'
    )
    script.chmod(0o755)
    return script


@dataclass
class MthreadsNode:
    """One fake Moore Threads machine."""

    directory: Path
    library: Path
    gpus: list[Gpu]

    def write(self) -> None:
        (self.directory / "mtml.conf").write_text("".join(g.line() + "\n" for g in self.gpus))
        for i, g in enumerate(self.gpus):
            drm = self.directory / "sys" / "bus" / "pci" / "devices" / g.bdf / "drm"
            drm.mkdir(parents=True, exist_ok=True)
            (drm / f"card{i + 1}").mkdir(exist_ok=True)
            (drm / f"renderD{128 + i}").mkdir(exist_ok=True)
        write_gmi(self.directory / "bin", gmi_output(self.gpus))

    def config(self, source: str = "mtml", **extra: Any) -> dict[str, Any]:
        return {
            "mtmlLibrary": str(self.library) if source == "mtml" else str(self.directory / "absent.so"),
            "mthreadsGmi": str(self.directory / "bin" / "mthreads-gmi"),
            "sysfsRoot": str(self.directory / "sys"),
            **extra,
        }

    def plugins(self, source: str = "mtml", **extra: Any) -> VendorPlugins:
        return VendorPlugins.from_plugins({"mthreads": plugin}, config={"mthreads": self.config(source, **extra)})


@pytest.fixture
def mthreads_node(
    tmp_path: Path, fake_mtml: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[Gpu]], MthreadsNode]]:
    def make(gpus: list[Gpu]) -> MthreadsNode:
        node = MthreadsNode(tmp_path / "node", fake_mtml, gpus)
        node.directory.mkdir(exist_ok=True)
        node.write()
        monkeypatch.setenv("FAKE_MTML_CONFIG", str(node.directory / "mtml.conf"))
        return node

    monkeypatch.delenv("FAKE_MTML_FAIL", raising=False)
    yield make
    os.environ.pop("FAKE_MTML_FAIL", None)


class Fakes:
    """The helpers above, for the test modules (which cannot import this file)."""

    Gpu = Gpu
    GIB = GIB
    s4000_server = staticmethod(s4000_server)
    gmi_output = staticmethod(gmi_output)
    write_gmi = staticmethod(write_gmi)


@pytest.fixture
def fakes() -> type[Fakes]:
    return Fakes
