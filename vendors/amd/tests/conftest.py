"""Fixtures for the AMD tests: a fake AMD SMI (``libamd_smi.so``) built from C, and the machines it pretends to be.

`fake_amdsmi` compiles ``fake_amdsmi/fake_amdsmi.c`` once per session (``fake_amdsmi/machine.py``); the plugin is
pointed at a copy of it through ``amdSmiLibrary``, so the binding loads and calls it exactly as ROCm's. `machine`
writes a machine (a list of ``Gpu``) beside that copy, with the sysfs tree the amdgpu driver would show.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import hami_vendor_amd.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.sandbox import NoCompilerError


def _fake() -> ModuleType:
    """``fake_amdsmi/machine.py``, loaded once by path (a conftest cannot be imported under the importlib mode)."""
    name = "hami_amd_test_machine"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "fake_amdsmi" / "machine.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


FAKE = _fake()


@pytest.fixture(scope="session")
def fake_amdsmi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        library: Path = FAKE.build_fake_amdsmi(tmp_path_factory.mktemp("fake-amdsmi"))
    except NoCompilerError as exc:
        pytest.fail(f"the AMD tests build a fake AMD SMI in C: {exc}")
    return library


@pytest.fixture
def machine(fake_amdsmi: Path, tmp_path: Path) -> Callable[..., Any]:
    count = iter(range(1000))

    def make(*gpus: Any) -> Any:
        return FAKE.write_machine(tmp_path / f"machine{next(count)}", fake_amdsmi, gpus)

    return make


def amd_plugins(config: Mapping[str, Any]) -> VendorPlugins:
    return VendorPlugins.from_plugins({"amd": plugin}, config={"amd": dict(config)})


@dataclass(frozen=True)
class Kit:
    """What the tests use from here (conftest.py cannot be imported under --import-mode=importlib)."""

    gpu: Callable[..., Any]
    plugins: Callable[[Mapping[str, Any]], VendorPlugins]
    write_machine: Callable[..., Any]


@pytest.fixture
def amd() -> Kit:
    return Kit(FAKE.gpu, amd_plugins, FAKE.write_machine)
