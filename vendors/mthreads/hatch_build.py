"""Build hook of hami-vendor-mthreads: compiles the Moore Threads isolation library ``libvmusa.so`` into the package.

hatchling runs it for every build (``[tool.hatch.build.hooks.custom]``). The library is hami-core's C core with its
CUDA-compatible hook layer (``hami/isolation/cuda/``: every hook of the MUSA driver API, named by
``isolation/hami_cuda_vendor.h``), its CUDA-runtime-shaped layer (``hami/isolation/rt/``: every hook of the MUSA
runtime, named by ``isolation/hami_rt_vendor.h``) and what is Moore Threads' own (``isolation/``: the driver's
unversioned names, ``libvmusa.map``, the exports). How it is compiled and packaged (wheel:
``hami_vendor_mthreads/lib/libvmusa.so``, a platform wheel; editable install: into the source tree; sdist: with the
C core under ``isolation/_core/``) is hami-core's (``hami/isolation/build.py``).

The C core is looked for in ``$HAMI_ISOLATION_CORE_DIR``, then ``isolation/_core`` (an sdist), then
``../../core/src/hami/isolation`` (a checkout), then an installed hami-core. Rebuild an editable install's library
after changing C sources with ``python vendors/mthreads/hatch_build.py``. Nothing here is imported at run time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported for its helpers (tests) where hatchling is not installed
    BuildHookInterface = object  # type: ignore[misc,assignment]

HERE = Path(__file__).resolve().parent


def _load_build_helper() -> ModuleType:
    """hami-core's build.py, from the first place that has the C core with its CUDA-compatible layer."""
    places = [Path(os.environ["HAMI_ISOLATION_CORE_DIR"])] if os.environ.get("HAMI_ISOLATION_CORE_DIR") else []
    places += [HERE / "isolation" / "_core", HERE.parent.parent / "core" / "src" / "hami" / "isolation"]
    found = importlib.util.find_spec("hami")
    places += [Path(p) / "isolation" for p in (found.submodule_search_locations or [])] if found else []
    for place in places:
        if all((place / f).is_file() for f in ("cuda/hami_cuda.h", "rt/hami_rt.h", "build.py")):
            spec = importlib.util.spec_from_file_location("_hami_isolation_build", place / "build.py")
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules.setdefault(spec.name, module)
            spec.loader.exec_module(module)
            module.CORE = place.resolve()  # type: ignore[attr-defined]
            return module
    raise RuntimeError(
        "cannot find hami-core's C isolation core with its CUDA-compatible hook layer (hami/isolation/build.py and "
        "cuda/hami_cuda.h); looked in " + ", ".join(map(str, places)) + ". Build from a checkout, from the sdist, "
        "with hami-core installed in the build environment, or point HAMI_ISOLATION_CORE_DIR at core/src/hami/isolation"
    )


build = _load_build_helper()
CORE: Path = build.CORE
SPEC = build.LibrarySpec(
    distribution="hami-vendor-mthreads",
    package="hami_vendor_mthreads",
    library="libvmusa.so",
    what="Moore Threads isolation library",
    hooks=HERE / "isolation",
    version_script="libvmusa.map",
    layers=("cuda", "rt"),
)


class IsolationBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles libvmusa.so into wheels and editable installs; adds the C core to the sdist."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._scratch = build.hatch_initialize(SPEC, CORE, Path(self.root), self.target_name, version, build_data)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        build.hatch_finalize(getattr(self, "_scratch", None))


if __name__ == "__main__":
    try:
        print(build.rebuild_in_place(SPEC, CORE, HERE))
    except build.IsolationLibraryError as exc:
        sys.exit(str(exc))
