"""Building a vendor's isolation library: hami-core's C core and the vendor's hooks compiled into one shared object.

The one place that knows how an isolation library is built and packaged. A vendor package describes its library
in its ``pyproject.toml``, in the table of hatchling's custom build hook, and nowhere else::

    [tool.hatch.build.hooks.custom]
    path = "hatch_build.py"   # the same few lines in every vendor package (see below)
    library = "libvgpu.so"    # file name and SONAME; the export list is isolation/libvgpu.map
    what = "CUDA isolation library"   # for messages
    layers = ["cuda"]         # hook layers of the core it is built on (optional)

(`spec_from_config` lists every key and its default: ``hooks`` ``"isolation"``, ``version-script``
``<library stem>.map``, ``package`` the distribution's name with ``_`` for ``-``, ``libraries`` ``["dl"]``.)
Hatchling then runs the hook for every build:

- wheel: compiles the C core (``hami/isolation/*.c``), the hook layers named (``hami/isolation/<layer>/*.c``,
  e.g. ``cuda``, the CUDA-compatible layer) and the vendor's hooks (``<vendor>/isolation/*.c``) with the
  system C compiler (C11, warnings as errors, hidden visibility, the vendor's version script as the export list)
  and ships the result as ``<package>/lib/<library>``; the wheel is then platform-specific
  (``py3-none-<platform>``: the library does not depend on Python's ABI);
- editable install: compiles into the source tree (``src/<package>/lib/<library>``), where the editable package
  is imported from (`rebuild_in_place` does the same from the command line: ``python hatch_build.py``);
- sdist: adds the C core, this file included, under ``isolation/_core/`` so that the sdist builds without the
  rest of the repository.

A vendor's ``hatch_build.py`` only finds this file (``$HAMI_ISOLATION_CORE_DIR``, else an sdist's
``isolation/_core``, else the checkout's ``core/src/hami/isolation``, else an installed hami-core), loads it, and
binds what `vendor_hook` returns; every vendor's is the same file, byte for byte (``vendors/nvidia/hatch_build.py``
is the one to copy; a test holds the others equal to it). That bootstrap cannot live in hami-core: vendor packages
are built where hami-core is not installed (the image's build stage, an sdist built by pip), so the file that
finds the core must ship with the vendor.

No compiler, or a failed compile, raises `IsolationLibraryError` with what to do; so does a misspelled or
ill-typed key of the hook's table. Standard library only (hatchling's hook base is imported when present): this
file runs inside build environments where hami-core is not installed, loaded by file path. Nothing here is
imported at run time.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CFLAGS",
    "CORE_DIR_ENV",
    "CORE_FILES",
    "SDIST_CORE",
    "IsolationLibraryError",
    "LibrarySpec",
    "compile_library",
    "core_candidates",
    "find_compiler",
    "hatch_finalize",
    "hatch_hook",
    "hatch_initialize",
    "main",
    "platform_tag",
    "rebuild_in_place",
    "spec_from_config",
    "spec_from_pyproject",
    "vendor_hook",
]

SDIST_CORE = "isolation/_core"
"""Where an sdist carries the C core, relative to the vendor package's root."""
CORE_FILES = ("*.c", "*.h", "include/*.h", "LAYOUT.md", "GRANT.md", "build.py", "*/*.c", "*/*.h", "*/README.md")
"""The files of the C core an sdist needs (globs relative to the core's directory)."""
CORE_DIR_ENV = "HAMI_ISOLATION_CORE_DIR"
"""Environment variable naming the C core's directory, tried before anything else."""

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
    """An isolation library could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class LibrarySpec:
    """One vendor's isolation library: what it is called, where its hook sources are, what it exports."""

    distribution: str
    """The vendor's distribution name, e.g. ``hami-vendor-nvidia`` (for messages)."""
    package: str
    """The import package the library ships in, e.g. ``hami_vendor_nvidia``."""
    library: str
    """The library's file name (also its SONAME), e.g. ``libvgpu.so``."""
    what: str
    """What the library is, for messages: ``CUDA isolation library``."""
    hooks: Path
    """The vendor's C sources (``*.c``, headers beside them)."""
    version_script: str
    """The export list, a linker version script inside `hooks`."""
    libraries: tuple[str, ...] = ("dl",)
    """Libraries to link (``-l<name>``)."""
    layers: tuple[str, ...] = ()
    """Hook layers of the core the library is built on: subdirectories of the C core whose ``*.c`` are compiled in
    and whose headers are on the include path, e.g. ``("cuda",)``, the CUDA-compatible hook layer
    (``cuda/hami_cuda.h`` says what the vendor's ``hami_cuda_vendor.h`` in `hooks` must define)."""

    @property
    def wheel_path(self) -> str:
        """Where the library lives inside the wheel (and inside the installed package)."""
        return f"{self.package}/lib/{self.library}"


def core_candidates(root: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where a vendor package rooted at `root` may find the C core, in order: `CORE_DIR_ENV`, the sdist's copy,
    the checkout's ``core/src/hami/isolation``. (An installed hami-core is the caller's last resort.)"""
    env = os.environ if environ is None else environ
    found = [Path(env[CORE_DIR_ENV])] if env.get(CORE_DIR_ENV) else []
    return [*found, root / SDIST_CORE, root.parent.parent / "core" / "src" / "hami" / "isolation"]


def find_compiler(spec: LibrarySpec, environ: Mapping[str, str] | None = None) -> list[str]:
    """The C compiler command: $CC, else cc, gcc or clang on PATH."""
    env = os.environ if environ is None else environ
    built = f"{spec.distribution} compiles its {spec.what} {spec.library} from C at build time"
    if env.get("CC"):
        command = shlex.split(env["CC"])
        if command and shutil.which(command[0], path=env.get("PATH")):
            return command
        raise IsolationLibraryError(
            f"CC={env['CC']!r} is not an executable C compiler; {built}: set CC to a working compiler or unset it"
        )
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return [found]
    raise IsolationLibraryError(
        f"no C compiler found (looked for $CC, cc, gcc, clang on PATH): {built}. Install one (e.g. "
        f"`apt-get install gcc`, `dnf install gcc`, `apk add build-base`) or install a prebuilt {spec.distribution} "
        "wheel, which needs none"
    )


def compile_library(spec: LibrarySpec, output: Path, core: Path, compiler: list[str] | None = None) -> Path:
    """Compile the C core in `core` and the vendor's hooks into `output`; returns it."""
    cc = compiler if compiler is not None else find_compiler(spec)
    hooks = spec.hooks
    layers = [core / layer for layer in spec.layers]
    for layer in layers:
        if not layer.is_dir():
            raise IsolationLibraryError(
                f"{spec.library} is built on the hook layer {layer.name!r}, which the C core in {core} does not "
                "have: build against a hami-core of the same version"
            )
    sources = sorted(core.glob("*.c")) + [c for layer in layers for c in sorted(layer.glob("*.c"))]
    sources += sorted(hooks.glob("*.c"))
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *cc,
        *CFLAGS,
        f"-I{core / 'include'}",
        f"-I{core}",
        *(f"-I{layer}" for layer in layers),
        f"-I{hooks}",
        *map(str, sources),
        "-shared",
        "-o",
        str(output),
        f"-Wl,--version-script={hooks / spec.version_script}",
        "-Wl,-z,defs",
        "-Wl,-z,now",
        "-Wl,-z,relro",
        "-Wl,-Bsymbolic",
        f"-Wl,-soname,{spec.library}",
        *(f"-l{name}" for name in spec.libraries),
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise IsolationLibraryError(f"cannot run the C compiler {cc[0]}: {exc}") from None
    if proc.returncode != 0:
        raise IsolationLibraryError(
            f"compiling {spec.library} failed ({shlex.join(command)}):\n{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return output


def platform_tag() -> str:
    """The wheel platform tag of this machine, e.g. ``linux_x86_64``."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def hatch_initialize(
    spec: LibrarySpec, core: Path, root: Path, target: str, version: str, build_data: MutableMapping[str, Any]
) -> Path | None:
    """What a vendor's hatch build hook does in ``initialize`` (see the module's docstring).

    :param core: the C core's directory (where the hook found this file).
    :param root: the vendor package's root (``self.root``); `target` and `version` are hatchling's.
    :returns: a scratch directory to remove in ``finalize`` (`hatch_finalize`), or None.
    """
    if target == "sdist":
        if not (root / SDIST_CORE).is_dir():
            for pattern in CORE_FILES:
                for path in sorted(core.glob(pattern)):
                    build_data["force_include"][str(path)] = f"{SDIST_CORE}/{path.relative_to(core).as_posix()}"
        return None
    if target != "wheel":
        return None
    if version == "editable":
        compile_library(spec, root / "src" / spec.wheel_path, core)
        return None
    scratch = Path(tempfile.mkdtemp(prefix=f"hami-{Path(spec.library).stem}-"))
    library = compile_library(spec, scratch / spec.library, core)
    build_data["force_include"][str(library)] = spec.wheel_path
    build_data["pure_python"] = False
    build_data["tag"] = f"py3-none-{platform_tag()}"
    return scratch


def hatch_finalize(scratch: Path | None) -> None:
    """Remove what `hatch_initialize` left in its scratch directory."""
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def hatch_hook(spec: LibrarySpec, core: Path, base: type) -> type:
    """A hatch build hook class (`base`: hatchling's ``BuildHookInterface``) that builds `spec`'s library from the
    C core in `core`; `vendor_hook` makes the one a vendor's ``hatch_build.py`` binds, where hatchling finds it."""

    def initialize(self: Any, version: str, build_data: dict[str, Any]) -> None:
        self._scratch = hatch_initialize(spec, core, Path(self.root), self.target_name, version, build_data)

    def finalize(self: Any, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        hatch_finalize(getattr(self, "_scratch", None))

    doc = f"Compiles {spec.library} into wheels and editable installs; adds the C core to the sdist."
    namespace = {"PLUGIN_NAME": "custom", "initialize": initialize, "finalize": finalize, "__doc__": doc}
    return type("IsolationBuildHook", (base,), namespace)


def rebuild_in_place(spec: LibrarySpec, core: Path, root: Path) -> Path:
    """Rebuild the library of an editable install (``src/<package>/lib/<library>``); returns its path."""
    return compile_library(spec, root / "src" / spec.wheel_path, core)


HOOK_KEYS = {
    "library": "the library's file name and SONAME, e.g. libvgpu.so (required)",
    "what": "what the library is, for messages, e.g. CUDA isolation library (default: isolation library)",
    "hooks": "the folder of the vendor's C sources, relative to the package root (default: isolation)",
    "version-script": "the export list, a linker version script inside hooks (default: <library stem>.map)",
    "layers": 'hook layers of the C core the library is built on, e.g. ["cuda"] (default: none)',
    "libraries": 'libraries to link, e.g. ["dl"] (default: ["dl"])',
    "package": "the import package the library ships in (default: the distribution's name, - as _)",
}
"""The keys of ``[tool.hatch.build.hooks.custom]`` that describe a library, and what each means."""
_HATCH_KEYS = {"path", "dependencies", "require-runtime-dependencies", "require-runtime-features", "enable-by-default"}
"""Hatchling's own options of a build hook, allowed beside `HOOK_KEYS`."""


def spec_from_config(config: Mapping[str, Any], root: Path, distribution: str) -> LibrarySpec:
    """The library that a vendor package's hook table (`config`: ``[tool.hatch.build.hooks.custom]``) describes.

    :param root: the vendor package's root (where ``pyproject.toml`` is).
    :param distribution: the package's distribution name (``[project] name``).
    :raises IsolationLibraryError: a key is unknown, missing or of the wrong type (the message names it).
    """
    where = f"[tool.hatch.build.hooks.custom] of {distribution}"
    unknown = sorted(set(config) - set(HOOK_KEYS) - _HATCH_KEYS)
    if unknown:
        legal = ", ".join(HOOK_KEYS)
        raise IsolationLibraryError(f"{where}: unknown key {', '.join(map(repr, unknown))}; the keys are {legal}")

    def text(key: str, default: str | None) -> str:
        value = config.get(key, default)
        if not isinstance(value, str) or not value:
            raise IsolationLibraryError(f"{where}: {key} must be a non-empty string: {HOOK_KEYS[key]}")
        return value

    def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = config.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise IsolationLibraryError(f"{where}: {key} must be a list of names: {HOOK_KEYS[key]}")
        return tuple(value)

    library = text("library", None)
    return LibrarySpec(
        distribution=distribution,
        package=text("package", distribution.replace("-", "_")),
        library=library,
        what=text("what", "isolation library"),
        hooks=root / text("hooks", "isolation"),
        version_script=text("version-script", f"{Path(library).stem}.map"),
        libraries=names("libraries", ("dl",)),
        layers=names("layers", ()),
    )


def spec_from_pyproject(root: Path) -> LibrarySpec:
    """The library that the vendor package rooted at `root` describes in its ``pyproject.toml``."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise IsolationLibraryError(f"cannot read {root / 'pyproject.toml'}: {exc}") from None
    hooks = data.get("tool", {}).get("hatch", {}).get("build", {}).get("hooks", {})
    name = data.get("project", {}).get("name")
    if not isinstance(name, str) or not isinstance(hooks.get("custom"), dict):
        raise IsolationLibraryError(
            f"{root / 'pyproject.toml'} has no [project] name or no [tool.hatch.build.hooks.custom] table "
            'describing its isolation library (library = "lib<name>.so", ...)'
        )
    return spec_from_config(hooks["custom"], root, name)


def _hook_base() -> type:
    """hatchling's build hook base class; `object` where hatchling is not installed (tests import the hook)."""
    try:
        from hatchling.builders.hooks.plugin.interface import BuildHookInterface
    except ImportError:
        return object
    base: type = BuildHookInterface
    return base


def vendor_hook(root: Path, core: Path) -> tuple[LibrarySpec, type]:
    """What a vendor's ``hatch_build.py`` binds: the library its ``pyproject.toml`` describes, and the hatch build
    hook class that builds it from the C core in `core` (``SPEC, IsolationBuildHook = build.vendor_hook(HERE,
    CORE)``)."""
    spec = spec_from_pyproject(root)
    return spec, hatch_hook(spec, core, _hook_base())


def main(spec: LibrarySpec, core: Path, root: Path) -> int:
    """``python hatch_build.py``: rebuild the editable install's library in place; prints its path, or why not."""
    try:
        print(rebuild_in_place(spec, core, root))
    except IsolationLibraryError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
