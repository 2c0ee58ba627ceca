"""Building libvdcu.so: the package's hatch hook builds it from hami-core's C core with the shared build helper and
it exports exactly its hooks; a machine without a C compiler gets a clear error at build time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / "hatch_build.py"


def load_hook():
    spec = importlib.util.spec_from_file_location("hami_hygon_hatch_build", HOOK)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_compiler_is_a_clear_build_error(tmp_path):
    hook = load_hook()
    with pytest.raises(hook.build.IsolationLibraryError, match=r"no C compiler found.*hami-vendor-hygon"):
        hook.build.find_compiler(hook.SPEC, {"PATH": str(tmp_path)})


def test_the_library_exports_only_its_hooks(tmp_path, build, exports_of):
    hook = load_hook()
    from hami.isolation import source_dir

    library = hook.build.compile_library(hook.SPEC, tmp_path / "libvdcu.so", source_dir())
    assert exports_of(library) == build.exports
