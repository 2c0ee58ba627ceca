"""The fake AMD node the tests build: the fake AMD SMI compiled from ``fake_amdsmi.c`` and the machine it reads.

`build_fake_amdsmi` compiles the fake; `write_machine` puts a copy of it in a directory with the machine file beside it
(``fake_amdsmi.machine``, where the fake reads it) and the sysfs tree the amdgpu driver would show: each GPU's PCI
device with its NUMA node and DRM nodes, and the KFD topology (a CPU node, then one node per GPU with its
``unique_id`` and ``drm_render_minor``). Loaded by path by conftest.py and the tests, since a conftest
cannot be imported under pytest's importlib mode.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami.testing.sandbox import CSRC, find_compiler

SOURCE = Path(__file__).parent / "fake_amdsmi.c"


def build_fake_amdsmi(out: Path) -> Path:
    """Compile the fake into `out` (a directory); returns the library."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / "libamd_smi.so"
    cmd = [find_compiler(), "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
           "-fvisibility=hidden", f"-I{CSRC}", "-o", str(target), str(SOURCE), "-ldl"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake libamd_smi.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


@dataclass(frozen=True)
class Gpu:
    """One GPU of a fake machine."""

    uuid: str
    bus: int
    card: int
    render: int
    unique_id: int
    name: str = "AMD Instinct MI300X"
    cus: int = 304
    vram_mib: int = 196608
    numa: int = 0
    socket: int = 0
    drm: bool = True
    kfd: bool = True

    @property
    def bdf(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    def line(self) -> str:
        return f"{self.socket} {self.uuid} 0 {self.bus:x} 0 0 {self.cus} {self.vram_mib << 20} {self.numa} {self.name}"


def gpu(i: int, **overrides: Any) -> Gpu:
    """The i-th GPU of an MI300X node: PCI bus 0x{i}c, card{i+1}, renderD{129+i}, NUMA node i // 4."""
    defaults: dict[str, Any] = {"uuid": f"{i:02x}ff74a1-0000-1000-80e5-3fa5b5d4a2c{i}", "bus": 0x0C + 0x10 * i,
                                "card": i + 1, "render": 129 + i, "unique_id": 0x49A1C06B3B2D8F00 + i,
                                "numa": i // 4}  # fmt: skip
    return Gpu(**{**defaults, **overrides})


@dataclass(frozen=True)
class Machine:
    root: Path
    library: Path

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"amdSmiLibrary": str(self.library), "sysfsRoot": str(self.root / "sys"),
                "hookPath": str(self.root / "hook"), **extra}  # fmt: skip


def write_machine(root: Path, library: Path, gpus: Sequence[Gpu]) -> Machine:
    """A copy of the fake AMD SMI in `root` with `gpus` beside it, and their sysfs."""
    root.mkdir(parents=True, exist_ok=True)
    copy = root / "libamd_smi.so"
    shutil.copy(library, copy)
    (root / "fake_amdsmi.machine").write_text("".join(g.line() + "\n" for g in gpus))
    sys = root / "sys"
    nodes = sys / "class" / "kfd" / "kfd" / "topology" / "nodes"
    (nodes / "0").mkdir(parents=True, exist_ok=True)
    (nodes / "0" / "properties").write_text("cpu_cores_count 96\nsimd_count 0\nunique_id 0\ndrm_render_minor 0\n")
    for n, g in enumerate(gpus, start=1):
        device = sys / "bus" / "pci" / "devices" / g.bdf
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{g.numa}\n")
        if g.drm:
            (device / "drm" / f"card{g.card}").mkdir(parents=True, exist_ok=True)
            (device / "drm" / f"renderD{g.render}").mkdir(parents=True, exist_ok=True)
        if g.kfd:
            (nodes / str(n)).mkdir(parents=True, exist_ok=True)
            (nodes / str(n) / "properties").write_text(
                f"cpu_cores_count 0\nsimd_count {g.cus * 4}\ndrm_render_minor {g.render}\nunique_id {g.unique_id}\n"
            )
    return Machine(root, copy)
