"""Fixtures for the Biren tests: a fake ``libbiren-ml.so`` built from C, and the machines it pretends to be.

`fake_brml` compiles ``fake_brml/fake_brml.c`` once per session (also naming it in ``HAMI_TEST_FAKE_BRML`` for the
conformance kit's fixture); the plugin is pointed at it through ``brmlLibrary``, so the binding loads and calls it
exactly as the real one. `machine` writes the cards where the fake reads them (``FAKE_BRML_CONFIG``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hami.testing.sandbox import CSRC, NoCompilerError, find_compiler

SOURCE = Path(__file__).parent / "fake_brml" / "fake_brml.c"


@pytest.fixture(scope="session", autouse=True)
def fake_brml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        cc = find_compiler()
    except NoCompilerError as exc:
        pytest.fail(f"the Biren tests build a fake libbiren-ml.so in C: {exc}")
    target = tmp_path_factory.mktemp("fake-brml") / "libbiren-ml.so"
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
           f"-I{CSRC}", "-o", str(target), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the fake libbiren-ml.so failed:\n{' '.join(cmd)}\n{done.stderr}")
    os.environ["HAMI_TEST_FAKE_BRML"] = str(target)
    return target


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Writes the fake BRML's machine, one card per (uuid, product name, memory MiB, node id)."""

    def write(*cards: tuple[str, str, int, int]) -> Path:
        path = tmp_path / "brml.machine"
        path.write_text("".join(f"{u} {n} {m} {i}\n" for u, n, m, i in cards))
        monkeypatch.setenv("FAKE_BRML_CONFIG", str(path))
        return path

    return write
