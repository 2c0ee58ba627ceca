"""Build hook of this vendor package: hami-core's isolation-library build, for the library described by
``[tool.hatch.build.hooks.custom]`` in ``pyproject.toml``.

Every vendor package has this same file, byte for byte (copy it as it is; a test holds them equal). It only finds
hami-core's C core, which carries the build code (``hami/isolation/build.py``: what is built, where, and the
table's keys): ``$HAMI_ISOLATION_CORE_DIR``, else an sdist's ``isolation/_core``, else this checkout's
``core/src/hami/isolation``, else an installed hami-core. ``python hatch_build.py`` rebuilds an editable
install's library after a C source changed. Nothing here is imported at run time.
"""

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_hami = importlib.util.find_spec("hami")
_places = [Path(os.environ["HAMI_ISOLATION_CORE_DIR"])] if os.environ.get("HAMI_ISOLATION_CORE_DIR") else []
_places += [HERE / "isolation" / "_core", HERE.parent.parent / "core" / "src" / "hami" / "isolation"]
_places += [Path(p) / "isolation" for p in (_hami.submodule_search_locations or [])] if _hami else []
_found = [p for p in _places if (p / "build.py").is_file() and (p / "include" / "hami_isolation.h").is_file()]
if not _found:
    raise RuntimeError(
        "cannot find hami-core's C isolation core (hami/isolation/include/hami_isolation.h and build.py); looked in "
        + ", ".join(map(str, _places))
        + ". Build from a checkout of the repository, from the sdist, with hami-core installed in the build "
        "environment, or point HAMI_ISOLATION_CORE_DIR at core/src/hami/isolation"
    )
CORE = _found[0].resolve()
_spec = importlib.util.spec_from_file_location("_hami_isolation_build", CORE / "build.py")
assert _spec is not None
assert _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, build)
_spec.loader.exec_module(build)
SPEC, IsolationBuildHook = build.vendor_hook(HERE, CORE)

if __name__ == "__main__":
    sys.exit(build.main(SPEC, CORE, HERE))
