"""Fixtures for the MetaX tests: a fake ``libmxsml.so`` built from C, a fake ``mx-smi``, and the machines they
pretend to be.

`fake_mxsml` compiles ``fake_mxsml/fake_mxsml.c`` once per session; the plugin is pointed at it through
``mxsmlLibrary``, so the binding loads and calls it exactly as the real one. `metax_node` writes a machine (a list
of `Gpu`) where the fake reads it (``FAKE_MXSML_CONFIG``), as ``mx-smi -L`` and ``mx-smi`` print it, and as sysfs
shows each card's DRM nodes and NUMA node; and builds `VendorPlugins` reading it from either source.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_metax.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_mxsml" / "fake_mxsml.c"
GIB = 1024**3


@pytest.fixture(scope="session")
def fake_mxsml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        cc = find_compiler()
    except NoCompilerError as exc:
        pytest.fail(f"the MetaX tests build a fake libmxsml.so in C: {exc}")
    target = tmp_path_factory.mktemp("fake-mxsml") / "libmxsml.so"
    cmd = [
        cc,
        "-std=c11",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        f"-I{CSRC}",
        "-o",
        str(target),
        str(SOURCE),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the fake libmxsml.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


@dataclass(frozen=True)
class Gpu:
    """One card of a fake machine."""

    bus: int
    uuid: str
    name: str = "MXC500"
    total: int = 64 * GIB
    used: int = 0
    healthy: bool = True
    link: int = 0
    """MetaXLink group (0: none)."""
    numa: int = 0
    card: int = 0

    @property
    def bdf(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    def line(self) -> str:
        kib = f"{self.total // 1024} {self.used // 1024}"
        return f"{self.bdf} {self.uuid} {self.name} {kib} {int(self.healthy)} {self.link}"


def c500_server(count: int = 8, links: Sequence[int] | None = None) -> list[Gpu]:
    """C500 cards, cards 1.. with render nodes 128..; MetaXLink groups of four unless `links` says otherwise."""
    groups = list(links) if links is not None else [1 + i // 4 for i in range(count)]
    return [
        Gpu(
            bus=0x10 + i, uuid=f"GPU-c500{i:04d}-0000-0000-0000-00000000000{i}", link=groups[i], numa=i // 4, card=i + 1
        )
        for i in range(count)
    ]


def mx_smi_listing(gpus: Sequence[Gpu]) -> str:
    """What ``mx-smi -L`` prints."""
    lines = ["mx-smi  version: 2.2.4", ""]
    for i, g in enumerate(gpus):
        state = "Available" if g.healthy else "Unavailable"
        lines.append(f"GPU#{i}    {g.name}      {g.bdf}   {state} (UUID: {g.uuid})")
    return "\n".join(lines) + "\n"


def mx_smi_table(gpus: Sequence[Gpu]) -> str:
    """What ``mx-smi`` prints (its default table)."""
    rule = "+" + "-" * 37 + "+" + "-" * 21 + "+" + "-" * 22 + "+"
    lines = [
        "mx-smi  version: 2.2.4",
        "",
        "=================== MetaX System Management Interface Log ===================",
        f"Timestamp                                         : Mon Dec  1 10:00:00 2026\n\nAttached GPUs : {len(gpus)}",
        rule,
        "| MX-SMI 2.2.4                        Kernel Mode Driver Version: 2.14.8          |",
        "| MACA Version: 2.33.0.5              BIOS Version: 1.24.4.0                      |",
        rule,
        "| GPU         NAME                    | Bus-id              | GPU-Util             |",
        "| Temp        Pwr:Usage/Cap           | Memory-Usage        | GPU-State            |",
        rule.replace("-", "="),
    ]
    for i, g in enumerate(gpus):
        lines.append(f"| {i:<11} MetaX C500              | {g.bdf}        | 0%                   |")
        memory = f"{g.used // (1024 * 1024)}/{g.total // (1024 * 1024)} MiB"
        lines.append(f"| 36C         56W / 350W              | {memory:<19} | Available            |")
        lines.append(rule)
    return "\n".join(lines) + "\n"


def write_mx_smi(directory: Path, listing: str, table: str, exit_code: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "list.txt").write_text(listing)
    (directory / "table.txt").write_text(table)
    script = directory / "mx-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" = "-L" ]; then cat "{directory / "list.txt"}"; exit {exit_code}; fi\n'
        f'if [ "$#" = 0 ]; then cat "{directory / "table.txt"}"; exit {exit_code}; fi\n'
        'echo "bad args: $*" >&2; exit 2\n'
    )
    script.chmod(0o755)
    return script


@dataclass
class MetaxNode:
    """One fake MetaX machine."""

    directory: Path
    library: Path
    gpus: list[Gpu]

    def write(self) -> None:
        (self.directory / "mxsml.conf").write_text("".join(g.line() + "\n" for g in self.gpus))
        for g in self.gpus:
            pci = self.directory / "sys" / "bus" / "pci" / "devices" / g.bdf
            (pci / "drm" / f"card{g.card}").mkdir(parents=True, exist_ok=True)
            (pci / "drm" / f"renderD{127 + g.card}").mkdir(exist_ok=True)
            (pci / "numa_node").write_text(f"{g.numa}\n")
        write_mx_smi(self.directory / "bin", mx_smi_listing(self.gpus), mx_smi_table(self.gpus))

    def config(self, source: str = "mxsml", **extra: Any) -> dict[str, Any]:
        return {
            "mxsmlLibrary": str(self.library) if source == "mxsml" else str(self.directory / "absent.so"),
            "mxSmi": str(self.directory / "bin" / "mx-smi"),
            "sysfsRoot": str(self.directory / "sys"),
            "hookPath": str(self.directory / "metax"),
            "driverPath": "/opt/mxdriver-host",
            **extra,
        }

    def plugins(self, source: str = "mxsml", **extra: Any) -> VendorPlugins:
        return VendorPlugins.from_plugins({"metax": plugin}, config={"metax": self.config(source, **extra)})


@pytest.fixture
def metax_node(
    tmp_path: Path, fake_mxsml: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[Gpu]], MetaxNode]]:
    def make(gpus: list[Gpu]) -> MetaxNode:
        node = MetaxNode(tmp_path / "node", fake_mxsml, gpus)
        node.directory.mkdir(exist_ok=True)
        node.write()
        monkeypatch.setenv("FAKE_MXSML_CONFIG", str(node.directory / "mxsml.conf"))
        return node

    monkeypatch.delenv("FAKE_MXSML_FAIL", raising=False)
    return make


class Fakes:
    """The helpers above, for the test modules (which cannot import this file)."""

    Gpu = Gpu
    GIB = GIB
    c500_server = staticmethod(c500_server)
    mx_smi_listing = staticmethod(mx_smi_listing)
    mx_smi_table = staticmethod(mx_smi_table)
    write_mx_smi = staticmethod(write_mx_smi)


@pytest.fixture
def fakes() -> type[Fakes]:
    return Fakes
