"""The isolation tests' sandbox for Ascend: the installed libvnpu.so in front of a fake Ascend stack built here.

hami.testing.sandbox does the work; this file says what is Ascend's: ``libvnpu.so`` inside the installed
``hami_vendor_ascend`` package, the fake runtime (``libruntime.so``, over hami.testing's fake device: the
"hardware"), the fake AscendCL (``libascendcl.so``, linked against it and reaching it through the PLT as the real one
does), the client program the tests and the benchmark drive, the ASCEND_* variables, and the ctypes prelude. `build`
(once per session) compiles them; `sandbox` (per test) is a hami.testing.sandbox.Sandbox.

To run the same tests against a real NPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real
``libascendcl.so``/``libruntime.so`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hami.testing.isolation import LINKER_DOORS
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

# Every function libvnpu.so hooks: the contract of its export list.
RT_HOOKS = (
    "rtMalloc",
    "rtFree",
    "rtMallocPhysical",
    "rtFreePhysical",
    "rtMemGetInfoEx",
    "rtMemGetInfo",
    "rtSetDevice",
    "rtCtxSetCurrent",
    "rtKernelLaunch",
    "rtKernelLaunchWithFlagV2",
    "rtKernelLaunchWithHandleV2",
    "rtAicpuKernelLaunchExWithArgs",
    "rtAicpuKernelLaunchWithFlag",
    "rtModelExecute",
)
ACL_HOOKS = (
    "aclrtMalloc",
    "aclrtMallocAlign32",
    "aclrtMallocCached",
    "aclrtFree",
    "aclrtMallocPhysical",
    "aclrtFreePhysical",
    "aclrtGetMemInfo",
    "aclrtSetDevice",
    "aclrtSetCurrentContext",
    "aclrtLaunchKernel",
    "aclrtLaunchKernelWithConfig",
    "aclopExecuteV2",
    "aclmdlExecute",
    "aclmdlExecuteAsync",
)


# Before every ctypes script (after hami.testing.sandbox's own start): AscendCL and the runtime as an application
# sees them (with libvnpu.so preloaded, every hooked name resolves to it), device 0 set, and small helpers.
PRELUDE = r"""
OOM = 207001

class DrvMemProp(Structure):
    _fields_ = [("side", c_uint32), ("devid", c_uint32), ("module_id", c_uint32), ("pg_type", c_uint32),
                ("mem_type", c_uint32), ("reserve", c_uint64)]

class AclLocation(Structure):
    _fields_ = [("id", c_uint32), ("type", c_int)]

class AclPhysicalProp(Structure):
    _fields_ = [("handle_type", c_int), ("allocation_type", c_int), ("mem_attr", c_int), ("location", AclLocation),
                ("reserve", c_uint64)]

def load_acl():
    # AscendCL and the runtime as a program linked against them sees them: names are looked up in the global
    # scope, where the preloaded libvnpu.so comes first (a lookup on the libraries' own handles finds the real ones).
    ctypes.CDLL("libascendcl.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_runtime = load_acl

def use_device(acl, device=0):
    assert acl.aclrtSetDevice(device) == 0
"""


SETUP = IsolationSetup(
    package="hami_vendor_ascend",
    library="libvnpu.so",
    project=HERE.parents[1],
    fakes=(
        fake_library("libruntime.so", HERE / "fake_runtime.c", FAKE_DEVICE),
        # No -Bsymbolic: AscendCL's calls into the runtime, and into its own exported functions, go through the PLT.
        fake_library("libascendcl.so", HERE / "fake_acl.c", symbolic=False, link=("-L{build}", "-lruntime")),
    ),
    client=CTarget(
        "client",
        (HERE / "client.c", ISOLATION_CLIENT),
        link=("-L{build}", "-lascendcl", "-lruntime", "-Wl,-rpath-link,{build}"),
    ),
    exports=frozenset({*LINKER_DOORS, *RT_HOOKS, *ACL_HOOKS}),
    hooks={"runtime": RT_HOOKS, "acl": ACL_HOOKS},
    fake_prefix="FAKE_NPU_",
    memory_limit_variable="ASCEND_DEVICE_MEMORY_LIMIT",
    core_limit_variable="ASCEND_DEVICE_CORE_LIMIT",
    accounting_variable="ASCEND_DEVICE_MEMORY_SHARED_CACHE",
    log_level_variable="LIBVNPU_LOG_LEVEL",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)


@pytest.fixture(scope="session")
def exports_of() -> Callable[[Path], set[str]]:
    """What a shared library exports (for libraries a test builds itself)."""
    return exported_functions
