"""The isolation tests' sandbox for MetaX: the installed libvmaca.so in front of a fake MACA runtime built here.

hami.testing.rt does the work (the fake runtime, the client and the export list, from isolation/hami_rt_vendor.h);
this file says what is MetaX's: ``libvmaca.so`` inside the installed ``hami_vendor_metax`` package, the fake
runtime's name ``libmcruntime.so`` and variables (``FAKE_MX_*``), and the ctypes prelude. To run the same tests
against a real MetaX GPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real ``libmcruntime.so``.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.rt import rt_isolation_setup
from hami.testing.sandbox import fixtures

HERE = Path(__file__).resolve().parent
PRELUDE = r"""
OOM = 2

def load_maca():
    # the runtime as a program linked against it sees it: names are looked up in the global scope, where the
    # preloaded libvmaca.so comes first
    ctypes.CDLL("libmcruntime.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_acl = load_maca

def use_device(mc, device=0):
    assert mc.mcSetDevice(device) == 0
"""

SETUP = rt_isolation_setup(
    package="hami_vendor_metax",
    library="libvmaca.so",
    project=HERE.parents[1],
    runtime="libmcruntime.so",
    fake_prefix="FAKE_MX_",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)
