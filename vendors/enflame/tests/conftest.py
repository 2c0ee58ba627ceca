"""Fixtures for the Enflame tests: a fake ``libefml.so`` built from C, a fake ``efsmi``, and the machines they
pretend to be.

`fake_efml` compiles ``fake_efml/fake_efml.c`` once per session; the plugin is pointed at it through
``efmlLibrary``, so the binding loads and calls it exactly as the real one. `machine` writes GCUs where the fake
reads them (``FAKE_EFML_CONFIG``); `efsmi` writes a tool that prints a given ``efsmi -q`` report.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_efml" / "fake_efml.c"


def build_fake_efml(directory: Path) -> Path:
    target = directory / "libefml.so"
    cmd = [find_compiler(), "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
           "-fvisibility=hidden", f"-I{CSRC}", "-o", str(target), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the fake libefml.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


@pytest.fixture(scope="session", autouse=True)
def fake_efml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake EFML, also named in ``HAMI_TEST_FAKE_EFML`` for the conformance kit's fixture (which takes no
    pytest fixtures)."""
    try:
        library = build_fake_efml(tmp_path_factory.mktemp("fake-efml"))
    except NoCompilerError as exc:
        pytest.fail(f"the Enflame tests build a fake libefml.so in C: {exc}")
    os.environ["HAMI_TEST_FAKE_EFML"] = str(library)
    return library


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Writes the fake EFML's machine, one GCU per (uuid, name, memory MiB, health 0/1/x, PCI address, NUMA)."""

    def write(*gcus: tuple[str, str, int, str, str, int]) -> Path:
        path = tmp_path / "efml.machine"
        path.write_text("".join(f"{u} {n} {m} {h} {b} {numa}\n" for u, n, m, h, b, numa in gcus))
        monkeypatch.setenv("FAKE_EFML_CONFIG", str(path))
        monkeypatch.delenv("FAKE_EFML_NO_DRIVER", raising=False)
        return path

    return write


@pytest.fixture
def efsmi(tmp_path: Path) -> Callable[[str], Path]:
    """A fake ``efsmi`` that prints `report` for ``-q`` and fails otherwise."""

    def write(report: str) -> Path:
        (tmp_path / "efsmi.out").write_text(report)
        tool = tmp_path / "efsmi"
        tool.write_text(f'#!/bin/sh\n[ "$1" = "-q" ] || exit 2\ncat "{tmp_path / "efsmi.out"}"\n')
        tool.chmod(0o755)
        return tool

    return write
