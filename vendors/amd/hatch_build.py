"""Build hook of hami-vendor-amd: compiles the AMD isolation library ``libamvgpu.so`` into the package.

hatchling runs it for every build (``[tool.hatch.build.hooks.custom]``). How an isolation library is compiled and
packaged (wheel: into ``hami_vendor_amd/lib/libamvgpu.so``, a platform wheel; editable install: into the source
tree; sdist: with the C core under ``isolation/_core/``) is hami-core's, shared by every vendor
(``hami/isolation/build.py``); this file only finds the C core and says which library is AMD's: the core's
CUDA-runtime-shaped hook layer (``rt``) with HIP's names (``isolation/hami_rt_vendor.h``), exporting what
``isolation/libamvgpu.map`` lists.

The C core is looked for in ``$HAMI_ISOLATION_CORE_DIR``, then ``isolation/_core`` (an sdist), then
``../../core/src/hami/isolation`` (a checkout), then an installed hami-core. No compiler, or a failed compile,
stops the build with a message saying what to do. Rebuild an editable install's library after changing C sources
with ``python vendors/amd/hatch_build.py``. Nothing here is imported at run time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported for its helpers (tests) where hatchling is not installed
    BuildHookInterface = object  # type: ignore[misc,assignment]

HERE = Path(__file__).resolve().parent
LIBRARY = "libamvgpu.so"


def find_core(root: Path) -> Path:
    """The directory of hami-core's C isolation core, with its build helper (``build.py``)."""
    candidates = [Path(os.environ["HAMI_ISOLATION_CORE_DIR"])] if os.environ.get("HAMI_ISOLATION_CORE_DIR") else []
    candidates += [root / "isolation" / "_core", root.parent.parent / "core" / "src" / "hami" / "isolation"]
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
build = _load_helper(CORE)
SPEC = build.LibrarySpec(
    distribution="hami-vendor-amd",
    package="hami_vendor_amd",
    library=LIBRARY,
    what="AMD isolation library",
    hooks=HERE / "isolation",
    version_script="libamvgpu.map",
    layers=("rt",),
)


IsolationBuildHook = build.hatch_hook(SPEC, CORE, BuildHookInterface)


if __name__ == "__main__":
    try:
        print(build.rebuild_in_place(SPEC, CORE, HERE))
    except build.IsolationLibraryError as exc:
        sys.exit(str(exc))
