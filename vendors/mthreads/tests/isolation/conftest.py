"""The isolation tests' sandbox for Moore Threads: the installed libvmusa.so in front of a fake MUSA built here.

The MUSA driver API is CUDA's under the mu prefix, so the driver fake is the core's CUDA-compatible test kit
(hami.testing.cuda) built as ``libmusa.so.1`` with the mu names (``-DFAKE_CU_PREFIX=mu``); the MUSA runtime
``libmusart.so`` is this package's fake (``fake_musart.c``), over the same fake device (the FAKE_CUDA_ variables).
MTML is not NVML-compatible: no management library. What is Moore Threads': ``libvmusa.so`` inside the installed
``hami_vendor_mthreads`` package, the MUSA_* variables, the runtime hooks and the driver's unversioned names.
Beside the driver API's client, ``musa_launch`` (``musa_launch.c``) is a program of the runtime API linked against
``libmusart.so``, for the launch tests (``test_launch_exc.py``).
`build` (once per session) compiles them; `sandbox` (per test) is a hami.testing.sandbox.Sandbox.

To run the same tests on a Moore Threads machine, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding MUSA's
``libmusa.so.1`` and ``libmusart.so`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hami.testing.cuda import cuda_isolation_setup
from hami.testing.sandbox import FAKE_DEVICE, CTarget, fake_library, fixtures

HERE = Path(__file__).resolve().parent
ISOLATION = HERE.parents[1] / "isolation"

# The MUSA runtime's functions libvmusa.so hooks (isolation/hami_rt_vendor.h), and the driver's unversioned names it
# answers (isolation/aliases.c): with the driver layer's hooks, its export list (isolation/libvmusa.map).
MUSA_HOOKS = (
    "musaMalloc",
    "musaFree",
    "musaMallocManaged",
    "musaMallocAsync",
    "musaMallocFromPoolAsync",
    "musaFreeAsync",
    "musaMallocPitch",
    "musaMemGetInfo",
    "musaSetDevice",
    "musaLaunchKernel",
    "musaLaunchKernelExC",
    "musaLaunchCooperativeKernel",
    "musaGraphLaunch",
)
MU_ALIASES = ("muMemAlloc", "muMemAllocPitch", "muMemFree", "muMemGetInfo", "muDeviceTotalMem", "muCtxCreate")

RUNTIME_PRELUDE = r"""
MUSA_OOM = 2  # musaErrorMemoryAllocation

def load_musa():
    # the runtime as a program linked against it sees it: names are looked up in the global scope, where the
    # preloaded libvmusa.so comes first
    ctypes.CDLL("libmusart.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

class Dim3(Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]
"""

_BASE = cuda_isolation_setup(
    package="hami_vendor_mthreads",
    library="libvmusa.so",
    project=HERE.parents[1],
    driver="libmusa.so.1",
    management=None,
    env_prefix="MUSA",
    log_level_variable="LIBVMUSA_LOG_LEVEL",
    prefix="mu",
)
_runtime = fake_library("libmusart.so", HERE / "fake_musart.c", FAKE_DEVICE, symbolic=False)
_launcher = CTarget(
    "musa_launch",
    (HERE / "musa_launch.c",),
    (f"-I{ISOLATION}",),
    ("-L{build}", "-l:libmusart.so", "-Wl,-rpath-link,{build}"),
)

SETUP = replace(
    _BASE,
    fakes=(*_BASE.fakes, CTarget(_runtime.output, _runtime.sources, (*_runtime.flags, f"-I{ISOLATION}"))),
    exports=_BASE.exports | set(MUSA_HOOKS) | set(MU_ALIASES),
    hooks={**_BASE.hooks, "musa": MUSA_HOOKS},
    prelude=_BASE.prelude + RUNTIME_PRELUDE,
    helpers=(*_BASE.helpers, _launcher),
)


build, sandbox = fixtures(SETUP)
