"""Building libvgpu.so: a machine without a C compiler gets a clear error at build time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / "hatch_build.py"


def load_hook():
    if not HOOK.is_file():
        pytest.skip(f"{HOOK} is not here (tests run without the package's build files)")
    spec = importlib.util.spec_from_file_location("hami_nvidia_hatch_build", HOOK)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_compiler_is_a_clear_build_error(tmp_path):
    hook = load_hook()
    with pytest.raises(hook.build.IsolationLibraryError, match=r"no C compiler found.*apt-get install gcc"):
        hook.build.find_compiler(hook.SPEC, {"PATH": str(tmp_path)})


def test_a_cc_that_does_not_exist_is_named(tmp_path):
    hook = load_hook()
    with pytest.raises(hook.build.IsolationLibraryError, match="CC='no-such-cc' is not an executable C compiler"):
        hook.build.find_compiler(hook.SPEC, {"PATH": str(tmp_path), "CC": "no-such-cc"})


def test_the_library_builds_from_the_installed_core_sources(tmp_path):
    hook = load_hook()
    from hami.isolation import source_dir

    library = hook.build.compile_library(hook.SPEC, tmp_path / "libvgpu.so", source_dir())
    assert library.stat().st_size > 10_000
