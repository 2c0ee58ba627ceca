"""The isolation tests' sandbox for Hygon: the installed libvdcu.so in front of a fake DTK HIP runtime built here.

hami.testing.sandbox does the work; this file says what is Hygon's: ``libvdcu.so`` inside the installed
``hami_vendor_hygon`` package, the fake runtime ``libgalaxyhip.so`` (over hami.testing's fake device; built without
-Bsymbolic, so that its calls to its own exported functions go through the global scope as the real runtime's may),
the client program, the HIP_* variables, and the ctypes prelude. To run the same tests against a real DCU, point
``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real ``libgalaxyhip.so``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hami.testing.sandbox import (
    FAKE_DEVICE,
    ISOLATION_CLIENT,
    CTarget,
    IsolationSetup,
    exported_functions,
    fake_library,
    fixtures,
)

HERE = Path(__file__).resolve().parent
ISOLATION = HERE.parents[1] / "isolation"

# Every function libvdcu.so hooks: the contract of its export list.
HIP_HOOKS = (
    "hipMalloc",
    "hipFree",
    "hipMallocManaged",
    "hipMallocAsync",
    "hipMallocFromPoolAsync",
    "hipFreeAsync",
    "hipMallocPitch",
    "hipExtMallocWithFlags",
    "hipMemCreate",
    "hipMemRelease",
    "hipMemGetInfo",
    "hipDeviceTotalMem",
    "hipSetDevice",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipLaunchCooperativeKernel",
    "hipModuleLaunchKernel",
    "hipModuleLaunchCooperativeKernel",
    "hipExtModuleLaunchKernel",
    "hipHccModuleLaunchKernel",
    "hipGraphLaunch",
    "hipGetProcAddress",
)

PRELUDE = r"""
OOM = 2

def load_hip():
    # the runtime as a program linked against it sees it: names are looked up in the global scope, where the
    # preloaded libvdcu.so comes first
    ctypes.CDLL("libgalaxyhip.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_acl = load_hip

def use_device(hip, device=0):
    assert hip.hipSetDevice(device) == 0
"""

fake = fake_library("libgalaxyhip.so", HERE / "fake_hip.c", FAKE_DEVICE, symbolic=False)

SETUP = IsolationSetup(
    package="hami_vendor_hygon",
    library="libvdcu.so",
    project=HERE.parents[1],
    fakes=(CTarget(fake.output, fake.sources, (*fake.flags, f"-I{ISOLATION}"), fake.link),),
    client=CTarget(
        "client",
        (HERE / "client.c", ISOLATION_CLIENT),
        flags=(f"-I{ISOLATION}",),
        link=("-L{build}", "-lgalaxyhip", "-Wl,-rpath-link,{build}"),
    ),
    exports=frozenset(HIP_HOOKS),
    hooks={"hip": HIP_HOOKS},
    fake_prefix="FAKE_DCU_",
    memory_limit_variable="HIP_DEVICE_MEMORY_LIMIT",
    core_limit_variable="HIP_DEVICE_CORE_LIMIT",
    accounting_variable="HIP_DEVICE_MEMORY_SHARED_CACHE",
    log_level_variable="LIBVDCU_LOG_LEVEL",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)


@pytest.fixture(scope="session")
def exports_of() -> Callable[[Path], set[str]]:
    return exported_functions
