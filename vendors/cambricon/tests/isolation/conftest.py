"""The isolation tests' sandbox for Cambricon: the installed libvmlu.so in front of a fake CNDrv and a fake CNRT
built here.

hami.testing.sandbox does the work; this file says what is Cambricon's: ``libvmlu.so`` inside the installed
``hami_vendor_cambricon`` package, the fakes ``libcndrv.so`` (over hami.testing's fake device) and ``libcnrt.so``
(over the fake CNDrv, as the real CNRT is built on CNDrv), both without -Bsymbolic so that their calls to CNDrv's
exported functions go through the global scope as the real libraries' may, the client program, the CAMBRICON_*
variables, and the ctypes prelude. To run the same tests against a real MLU, point ``HAMI_ISOLATION_DRIVER_DIR``
at a directory holding the real ``libcndrv.so`` and ``libcnrt.so``.
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
ISOLATION = HERE.parents[1] / "isolation"

CN_HOOKS = (
    "cnMalloc",
    "cnMallocSecurity",
    "cnMallocNode",
    "cnZmalloc",
    "cnZmallocNode",
    "cnMallocConstant",
    "cnMallocNodeConstant",
    "cnMallocFrameBuffer",
    "cnMallocPeerAble",
    "cnFree",
    "cnMemAllocAsync",
    "cnMemAllocFromPoolAsync",
    "cnMemFreeAsync",
    "cnMemCreate",
    "cnMemRelease",
    "cnMemGetInfo",
    "cnMemGetNodeInfo",
    "cnDeviceTotalMem",
    "cnInvokeKernel",
    "cnInvokeKernelEx",
    "cnGetExportFunction",
)
CNRT_HOOKS = ("cnrtMalloc", "cnrtFree", "cnrtMemGetInfo", "cnrtDeviceGetAttribute", "cnrtInvokeKernel", "cnrtSetDevice")
LOOKUPS = tuple(sorted(LINKER_DOORS))

PRELUDE = r"""
OOM = 100100

def load_cnrt():
    # the libraries as a program linked against them sees them: names are looked up in the global scope, where
    # the preloaded libvmlu.so comes first
    ctypes.CDLL("libcndrv.so", mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL("libcnrt.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

def use_device(rt, device=0):
    assert rt.cnrtSetDevice(device) == 0
"""

cndrv = fake_library("libcndrv.so", HERE / "fake_cndrv.c", FAKE_DEVICE, symbolic=False)
cnrt = fake_library("libcnrt.so", HERE / "fake_cnrt.c", symbolic=False, link=("-L{build}", "-lcndrv"))

SETUP = IsolationSetup(
    package="hami_vendor_cambricon",
    library="libvmlu.so",
    project=HERE.parents[1],
    fakes=(
        CTarget(cndrv.output, cndrv.sources, (*cndrv.flags, f"-I{ISOLATION}"), cndrv.link),
        CTarget(cnrt.output, cnrt.sources, (*cnrt.flags, f"-I{ISOLATION}"), cnrt.link),
    ),
    client=CTarget(
        "client",
        (HERE / "client.c", ISOLATION_CLIENT),
        flags=(f"-I{ISOLATION}",),
        link=("-L{build}", "-lcnrt", "-lcndrv", "-Wl,-rpath-link,{build}"),
    ),
    exports=frozenset((*CN_HOOKS, *CNRT_HOOKS, *LOOKUPS)),
    hooks={"cndrv": CN_HOOKS, "cnrt": CNRT_HOOKS},
    fake_prefix="FAKE_MLU_",
    memory_limit_variable="CAMBRICON_DEVICE_MEMORY_LIMIT",
    core_limit_variable="CAMBRICON_DEVICE_CORE_LIMIT",
    accounting_variable="CAMBRICON_DEVICE_MEMORY_SHARED_CACHE",
    log_level_variable="LIBVMLU_LOG_LEVEL",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)


@pytest.fixture(scope="session")
def exports_of() -> Callable[[Path], set[str]]:
    return exported_functions
