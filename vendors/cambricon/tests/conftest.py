"""Fixtures for the Cambricon vendor's tests: a fake CNDev built from C, and the machines it pretends to be.

`build_fake_cndev` compiles ``fake_cndev/fake_cndev.c`` with the system C compiler into ``libcndev.so`` (and,
with ``-DOLD_DRIVER``, the variant without ``cndevGetMemoryUsageV2``); the plugin is pointed at it through the
``cndevLibrary`` setting, so the binding loads and calls it exactly as it would the real one. A machine is a list
of `Card` tuples, written where the fake reads it (``FAKE_CNDEV_CONFIG``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_cambricon.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import CSRC

SOURCE = Path(__file__).parent / "fake_cndev" / "fake_cndev.c"


Card = tuple[Any, ...]
"""One card of a fake machine: UUID (without ``MLU-``), card name, memory MB, MLU cores, health (1 healthy), and
optionally sMLU mode (1 on, the default) and the MLU-Link peers (comma-joined UUIDs, ``-`` a port down)."""


def four_mlu370() -> list[Card]:
    """Four MLU370-X8 cards of 24 GiB, the machine a test gets when it names none."""
    return [(f"a1b2c3d4-0000-0000-0000-00000000000{i}", "MLU370-X8", 24576, 8, 1) for i in range(4)]


def write_machine(path: Path, cards: Sequence[Card]) -> None:
    path.write_text("".join(" ".join(str(f) for f in card) + "\n" for card in cards))


_built: dict[str, Path] = {}


def build_fake_cndev(variant: str = "current") -> Path:
    """The fake libcndev.so (built once per process); skips the test without a C compiler."""
    if variant in _built:
        return _built[variant]
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        pytest.skip("the Cambricon tests build a fake CNDev in C and need a C compiler (set CC or install gcc)")
    target = Path(tempfile.mkdtemp(prefix=f"fake-cndev-{variant}-")) / "libcndev.so"
    flags = ["-DOLD_DRIVER"] if variant == "old" else []
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
           f"-I{CSRC}", *flags, "-o", str(target), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the fake CNDev failed:\n{' '.join(cmd)}\n{done.stderr}")
    _built[variant] = target
    return target


MachineHost = Callable[..., VendorPlugins]


@pytest.fixture
def mlu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MachineHost:
    """`mlu_node(cards, variant=..., **config)`: the machine written for the fake, and a host configured for it."""

    def make(cards: Sequence[Card] | None = None, *, variant: str = "current", **config: Any) -> VendorPlugins:
        machine = tmp_path / "machine.txt"
        write_machine(machine, four_mlu370() if cards is None else cards)
        monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(machine))
        monkeypatch.setenv("FAKE_CNDEV_STATE", str(tmp_path / "driver-state.txt"))
        section = {"cndevLibrary": str(build_fake_cndev(variant)), **config}
        return VendorPlugins.from_plugins({"cambricon": plugin}, config={"cambricon": section})

    return make
