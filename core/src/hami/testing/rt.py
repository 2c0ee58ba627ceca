"""The test kit of libraries on the CUDA-runtime-shaped hook layer (``hami/isolation/rt``): a fake runtime, the
client, and the sandbox setup, for any vendor whose runtime is CUDA's runtime under another prefix (HIP, MACA).

`rt_isolation_setup` reads what the vendor's ``isolation/hami_rt_vendor.h`` says (the prefix, the optional families
its runtime has, the environment variables' names) and builds the `hami.testing.sandbox.IsolationSetup` the shared
checks (`hami.testing.isolation`) run with: ``csrc/fake_rt.c`` built as the vendor's runtime library over the fake
device (without -Bsymbolic, so that its calls to its own exported functions go through the global scope as a real
runtime's may), ``csrc/rt_client.c`` linked against it, and the export list the layer gives that vendor. The header
is the one source of truth: the library, the fake and the client are compiled from it, and so is this list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from hami.testing.sandbox import CSRC, FAKE_DEVICE, ISOLATION_CLIENT, CTarget, IsolationSetup, fake_library

__all__ = ["FAKE_RT", "RT_CLIENT", "rt_hooks", "rt_isolation_setup", "vendor_header"]

FAKE_RT = CSRC / "fake_rt.c"
RT_CLIENT = CSRC / "rt_client.c"

COMMON_HOOKS = (
    "Malloc", "Free", "MallocManaged", "MallocAsync", "FreeAsync", "MallocPitch", "ExtMallocWithFlags", "MemGetInfo",
    "SetDevice", "LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "GraphLaunch",
)  # fmt: skip
OPTIONAL_HOOKS = {
    "POOL": ("MallocFromPoolAsync",),
    "VMM": ("MemCreate", "MemRelease"),
    "DEVICE_TOTAL_MEM": ("DeviceTotalMem",),
    "EXT_LAUNCH": ("ExtLaunchKernel", "ExtModuleLaunchKernel"),
    "HCC": ("HccModuleLaunchKernel",),
    "MODULE_COOPERATIVE": ("ModuleLaunchCooperativeKernel",),
    "PROC_ADDRESS": ("GetProcAddress",),
}
_DEFINE = re.compile(r"^#define\s+(HAMI_RT_\w+)\s+(.+?)\s*(?:/\*.*)?$", re.MULTILINE)


def vendor_header(isolation: Path) -> dict[str, str]:
    """The ``#define HAMI_RT_*`` values of ``<isolation>/hami_rt_vendor.h`` (strings unquoted)."""
    text = (isolation / "hami_rt_vendor.h").read_text()
    return {name: value.strip('"') if value.startswith('"') else value for name, value in _DEFINE.findall(text)}


def rt_hooks(defines: Mapping[str, str]) -> tuple[str, ...]:
    """Every function a library on the layer hooks for a vendor whose header says `defines`."""
    prefix = defines["HAMI_RT_PREFIX"]
    names = list(COMMON_HOOKS)
    for family, hooks in OPTIONAL_HOOKS.items():
        if defines.get(f"HAMI_RT_HAS_{family}", "0").strip() == "1":
            names.extend(hooks)
    return tuple(prefix + n for n in names)


def rt_isolation_setup(
    *, package: str, library: str, project: Path, runtime: str, fake_prefix: str, prelude: str
) -> IsolationSetup:
    """The sandbox setup of `library` (in `package`, built from `project`) over the fake runtime built as `runtime`
    (its variables prefixed `fake_prefix`); `prelude` is the vendor's API as a ctypes program sees it."""
    isolation = project / "isolation"
    defines = vendor_header(isolation)
    fake = fake_library(runtime, FAKE_RT, FAKE_DEVICE, symbolic=False)
    flags = (*fake.flags, f"-I{isolation}", f'-DFAKE_RT_ENV="{fake_prefix}"')
    hooks = rt_hooks(defines)
    return IsolationSetup(
        package=package,
        library=library,
        project=project,
        fakes=(CTarget(fake.output, fake.sources, flags, fake.link),),
        client=CTarget(
            "client",
            (RT_CLIENT, ISOLATION_CLIENT),
            flags=(f"-I{isolation}",),
            link=("-L{build}", f"-l:{runtime}", "-Wl,-rpath-link,{build}"),
        ),
        exports=frozenset(hooks),
        hooks={defines["HAMI_RT_PREFIX"]: hooks},
        fake_prefix=fake_prefix,
        memory_limit_variable=defines["HAMI_RT_ENV_MEMORY_LIMIT"],
        core_limit_variable=defines["HAMI_RT_ENV_CORE_LIMIT"],
        accounting_variable=defines["HAMI_RT_ENV_SHARED_CACHE"],
        log_level_variable=defines["HAMI_RT_ENV_LOG_LEVEL"],
        prelude=prelude,
    )
