"""The isolation tests' sandbox for Hygon: the installed libvdcu.so in front of a fake DTK HIP runtime built here.

hami.testing.rt does the work (the fake runtime, the client and the export list, from isolation/hami_rt_vendor.h);
this file says what is Hygon's: ``libvdcu.so`` inside the installed ``hami_vendor_hygon`` package, the fake
runtime's name ``libgalaxyhip.so`` and variables (``FAKE_DCU_*``), and the ctypes prelude. To run the same tests
against a real DCU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real ``libgalaxyhip.so``.
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
    # preloaded libvdcu.so comes first
    ctypes.CDLL("libgalaxyhip.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_acl = load_hip

def use_device(hip, device=0):
    assert hip.hipSetDevice(device) == 0
"""

SETUP = rt_isolation_setup(
    package="hami_vendor_hygon",
    library="libvdcu.so",
    project=HERE.parents[1],
    runtime="libgalaxyhip.so",
    fake_prefix="FAKE_DCU_",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)
