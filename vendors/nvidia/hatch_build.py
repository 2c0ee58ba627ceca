"""Build hook of hami-vendor-nvidia: compiles the CUDA isolation library ``libvgpu.so`` into the package.

hatchling runs it for every build (``[tool.hatch.build.hooks.custom]``):

- wheel: compiles hami-core's C core (``hami/isolation/*.c``, one copy, in ``core/``) with its CUDA-compatible
  hook layer (``hami/isolation/cuda/``, every hook) and NVIDIA's part (``isolation/``: the driver's library names,
  the variables' names, the export list) with the system C compiler and ships the result as
  ``hami_vendor_nvidia/lib/libvgpu.so``; the wheel is then platform-specific (``py3-none-<platform>``: the
  library does not depend on Python's ABI);
- editable install: compiles into the source tree (``src/hami_vendor_nvidia/lib/libvgpu.so``, ignored by git),
  where the editable package is imported from; rerun the install (or this file, ``python hatch_build.py``) after
  changing C sources;
- sdist: adds the C core under ``isolation/_core/`` so the sdist builds without the rest of the repository.

How a library is compiled and packaged is hami-core's (``hami/isolation/build.py``, shared by every vendor); this
file only finds the C core and says which library is NVIDIA's. The C core is looked for in
``$HAMI_ISOLATION_CORE_DIR``, then ``isolation/_core`` (an sdist), then ``../../core/src/hami/isolation`` (a
checkout), then an installed hami-core. No compiler, or a failed compile, stops the build with a message saying
what to do. Nothing here is imported at run time.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported for its compile helpers (tests) where hatchling is not installed
    BuildHookInterface = object  # type: ignore[misc,assignment]

HERE = Path(__file__).resolve().parent
LIBRARY = "libvgpu.so"
WHEEL_PATH = f"hami_vendor_nvidia/lib/{LIBRARY}"
SDIST_CORE = "isolation/_core"


def find_core(root: Path) -> Path:
    """The directory of hami-core's C isolation core (with its build helper, ``build.py``)."""
    candidates = [Path(os.environ["HAMI_ISOLATION_CORE_DIR"])] if os.environ.get("HAMI_ISOLATION_CORE_DIR") else []
    candidates += [root / SDIST_CORE, root.parent.parent / "core" / "src" / "hami" / "isolation"]
    spec = importlib.util.find_spec("hami")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "isolation" for p in spec.submodule_search_locations]
    for candidate in candidates:
        if (candidate / "include" / "hami_isolation.h").is_file() and (candidate / "build.py").is_file():
            return candidate.resolve()
    raise RuntimeError(
        "cannot find hami-core's C isolation core (hami/isolation/include/hami_isolation.h and build.py); looked in "
        + ", ".join(str(c) for c in candidates)
        + ". Build from a checkout of the repository, from the sdist, with hami-core installed in the build "
        "environment, or point HAMI_ISOLATION_CORE_DIR at core/src/hami/isolation"
    )


def _load_helper(core: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_hami_isolation_build", core / "build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


CORE = find_core(HERE)
_build = _load_helper(CORE)
IsolationLibraryError = _build.IsolationLibraryError
platform_tag = _build.platform_tag
SPEC = _build.LibrarySpec(
    distribution="hami-vendor-nvidia",
    package="hami_vendor_nvidia",
    library=LIBRARY,
    what="CUDA isolation library",
    hooks=HERE / "isolation",
    version_script="libvgpu.map",
    layers=("cuda",),
)


def find_compiler(environ: dict[str, str] | None = None) -> list[str]:
    """The C compiler command: $CC, else cc, gcc or clang on PATH."""
    result: list[str] = _build.find_compiler(SPEC, environ)
    return result


def compile_library(
    output: Path, core: Path, hooks: Path = HERE / "isolation", compiler: list[str] | None = None
) -> Path:
    """Compile the core and the NVIDIA hooks into `output`; returns it."""
    spec = SPEC if hooks == SPEC.hooks else dataclasses.replace(SPEC, hooks=hooks)
    result: Path = _build.compile_library(spec, output, core, compiler)
    return result


IsolationBuildHook = _build.hatch_hook(SPEC, CORE, BuildHookInterface)


if __name__ == "__main__":
    # Rebuild the library of an editable install in place: python vendors/nvidia/hatch_build.py
    try:
        target = _build.rebuild_in_place(SPEC, CORE, HERE)
    except IsolationLibraryError as exc:
        sys.exit(str(exc))
    print(target)
