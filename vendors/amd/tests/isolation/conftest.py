"""The isolation tests' sandbox for AMD: the installed libamvgpu.so in front of a fake ROCm HIP runtime built here.

hami.testing.rt does the work (the fake runtime, the client and the export list, from isolation/hami_rt_vendor.h);
this file says what is AMD's: ``libamvgpu.so`` inside the installed ``hami_vendor_amd`` package, the fake
runtime's name ``libamdhip64.so`` and variables (``FAKE_AMD_*``), and the ctypes prelude. To run the same tests
against a real GPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real ``libamdhip64.so``.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.rt import rt_isolation_setup
from hami.testing.sandbox import fixtures

HERE = Path(__file__).resolve().parent
PRELUDE = r"""
OOM = 2

def load_hip():
    # the runtime as a program linked against it sees it: names are looked up in the global scope, where the
    # preloaded libamvgpu.so comes first
    ctypes.CDLL("libamdhip64.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_acl = load_hip

def use_device(hip, device=0):
    assert hip.hipSetDevice(device) == 0
"""

SETUP = rt_isolation_setup(
    package="hami_vendor_amd",
    library="libamvgpu.so",
    project=HERE.parents[1],
    runtime="libamdhip64.so",
    fake_prefix="FAKE_AMD_",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)
