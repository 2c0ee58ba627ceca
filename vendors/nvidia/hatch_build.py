"""Build hook of hami-vendor-nvidia: compiles the CUDA isolation library ``libvgpu.so`` into the package.

hatchling runs it for every build (``[tool.hatch.build.hooks.custom]``):

- wheel: compiles hami-core's C core (``hami/isolation/*.c``, one copy, in ``core/``) and the NVIDIA hook layer
  (``isolation/*.c``) with the system C compiler and ships the result as ``hami_vendor_nvidia/lib/libvgpu.so``;
  the wheel is then platform-specific (``py3-none-<platform>``: the library does not depend on Python's ABI);
- editable install: compiles into the source tree (``src/hami_vendor_nvidia/lib/libvgpu.so``, ignored by git),
  where the editable package is imported from; rerun the install (or this file, ``python hatch_build.py``) after
  changing C sources;
- sdist: adds the C core under ``isolation/_core/`` so the sdist builds without the rest of the repository.

The C core is looked for in ``$HAMI_ISOLATION_CORE_DIR``, then ``isolation/_core`` (an sdist), then
``../../core/src/hami/isolation`` (a checkout), then an installed hami-core. No compiler, or a failed compile,
stops the build with a message saying what to do. Nothing here is imported at run time.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported for its compile helpers (tests) where hatchling is not installed
    BuildHookInterface = object  # type: ignore[misc,assignment]

HERE = Path(__file__).resolve().parent
LIBRARY = "libvgpu.so"
WHEEL_PATH = f"hami_vendor_nvidia/lib/{LIBRARY}"
SDIST_CORE = "isolation/_core"
CORE_FILES = ("*.c", "*.h", "include/*.h", "LAYOUT.md")

CFLAGS = [
    "-std=c11",
    "-O2",
    "-g0",
    "-fPIC",
    "-fvisibility=hidden",
    "-foptimize-sibling-calls",  # dlsym passes RTLD_NEXT lookups on by a tail call
    "-pthread",
    "-Wall",
    "-Wextra",
    "-Werror",
]


class IsolationLibraryError(RuntimeError):
    """libvgpu.so could not be built; the message says why and what to do."""


def find_compiler(environ: dict[str, str] | None = None) -> list[str]:
    """The C compiler command: $CC, else cc, gcc or clang on PATH."""
    env = os.environ if environ is None else environ
    if env.get("CC"):
        command = shlex.split(env["CC"])
        if command and shutil.which(command[0], path=env.get("PATH")):
            return command
        raise IsolationLibraryError(
            f"CC={env['CC']!r} is not an executable C compiler; hami-vendor-nvidia compiles its CUDA isolation "
            f"library {LIBRARY} from C at build time: set CC to a working compiler or unset it"
        )
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return [found]
    raise IsolationLibraryError(
        f"no C compiler found (looked for $CC, cc, gcc, clang on PATH): hami-vendor-nvidia compiles its CUDA "
        f"isolation library {LIBRARY} from C at build time. Install one (e.g. `apt-get install gcc`, "
        "`dnf install gcc`, `apk add build-base`) or install a prebuilt hami-vendor-nvidia wheel, which needs none"
    )


def find_core(root: Path) -> Path:
    """The directory of hami-core's C isolation core."""
    candidates = []
    if os.environ.get("HAMI_ISOLATION_CORE_DIR"):
        candidates.append(Path(os.environ["HAMI_ISOLATION_CORE_DIR"]))
    candidates += [root / SDIST_CORE, root.parent.parent / "core" / "src" / "hami" / "isolation"]
    spec = importlib.util.find_spec("hami")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "isolation" for p in spec.submodule_search_locations]
    for candidate in candidates:
        if (candidate / "include" / "hami_isolation.h").is_file():
            return candidate.resolve()
    raise IsolationLibraryError(
        "cannot find hami-core's C isolation core (hami/isolation/include/hami_isolation.h); looked in "
        + ", ".join(str(c) for c in candidates)
        + ". Build from a checkout of the repository, from the sdist, with hami-core installed in the build "
        "environment, or point HAMI_ISOLATION_CORE_DIR at core/src/hami/isolation"
    )


def compile_library(
    output: Path, core: Path, hooks: Path = HERE / "isolation", compiler: list[str] | None = None
) -> Path:
    """Compile the core and the NVIDIA hooks into `output`; returns it."""
    cc = compiler if compiler is not None else find_compiler()
    sources = sorted(core.glob("*.c")) + sorted(hooks.glob("*.c"))
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *cc,
        *CFLAGS,
        f"-I{core / 'include'}",
        f"-I{core}",
        f"-I{hooks}",
        *map(str, sources),
        "-shared",
        "-o",
        str(output),
        f"-Wl,--version-script={hooks / 'libvgpu.map'}",
        "-Wl,-z,defs",
        "-Wl,-z,now",
        "-Wl,-z,relro",
        "-Wl,-Bsymbolic",
        f"-Wl,-soname,{LIBRARY}",
        "-ldl",
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise IsolationLibraryError(f"cannot run the C compiler {cc[0]}: {exc}") from None
    if proc.returncode != 0:
        raise IsolationLibraryError(
            f"compiling {LIBRARY} failed ({shlex.join(command)}):\n{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return output


def platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class IsolationBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles libvgpu.so into wheels and editable installs; adds the C core to the sdist."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        if self.target_name == "sdist":
            if not (root / SDIST_CORE).is_dir():
                core = find_core(root)
                for pattern in CORE_FILES:
                    for path in sorted(core.glob(pattern)):
                        build_data["force_include"][str(path)] = f"{SDIST_CORE}/{path.relative_to(core).as_posix()}"
            return
        if self.target_name != "wheel":
            return
        core = find_core(root)
        if version == "editable":
            compile_library(root / "src" / WHEEL_PATH, core)
        else:
            self._scratch = Path(tempfile.mkdtemp(prefix="hami-vgpu-"))
            library = compile_library(self._scratch / LIBRARY, core)
            build_data["force_include"][str(library)] = WHEEL_PATH
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    # Rebuild the library of an editable install in place: python vendors/nvidia/hatch_build.py
    target = HERE / "src" / WHEEL_PATH
    try:
        compile_library(target, find_core(HERE))
    except IsolationLibraryError as exc:
        sys.exit(str(exc))
    print(target)
