"""How calls reach libvnpu.so and how it reaches the real stack: it exports exactly its hooks, resolves the real
functions on first use (a runtime that is not there, or lacks a function, gives a clean error, never a crash)."""

from __future__ import annotations

import ctypes.util
import subprocess

import pytest

INTERNAL_ERROR, NOT_SUPPORTED = 507000, 207000


def test_the_library_exports_exactly_its_hooks(build):
    assert build.exported() == build.exports


MISSING = r"""
g = ctypes.CDLL(None)  # the global scope: the preloaded libvnpu.so's hooks, and no Ascend library at all
p, free, total = c_void_p(), c_size_t(), c_size_t()
RESULT = {
    "rtMalloc": g.rtMalloc(byref(p), c_uint64(1 << 20), 2, 0),
    "rtMemGetInfoEx": g.rtMemGetInfoEx(1, byref(free), byref(total)),
    "rtKernelLaunch": g.rtKernelLaunch(c_void_p(1), 1, None, 0, None, None),
    "rtSetDevice": g.rtSetDevice(0),
    "aclrtMalloc": g.aclrtMalloc(byref(p), c_size_t(1 << 20), 0),
    "aclrtGetMemInfo": g.aclrtGetMemInfo(1, byref(free), byref(total)),
    "aclrtLaunchKernel": g.aclrtLaunchKernel(c_void_p(1), 1, None, c_size_t(0), None),
    "aclmdlExecute": g.aclmdlExecute(1, None, None),
}
"""


def test_without_the_ascend_libraries_every_hook_fails_cleanly(sandbox):
    if ctypes.util.find_library("ascendcl") or ctypes.util.find_library("runtime"):
        pytest.skip("this machine has a real Ascend stack")
    env = sandbox.env()
    env["LD_LIBRARY_PATH"] = str(sandbox.root)  # no libruntime.so, no libascendcl.so
    result = sandbox.python(MISSING, env)
    assert result == dict.fromkeys(result, INTERNAL_ERROR)
    assert len(result) == 8


OLD_RUNTIME = r"""
#include <stdint.h>
#include <stdlib.h>
static __thread int device = -1;
int rtSetDevice(int d) { device = d; return 0; }
int rtGetDevice(int *d) { if (device < 0) return 107002; *d = device; return 0; }
int rtGetDeviceCount(int *n) { *n = 1; return 0; }
int rtMalloc(void **p, uint64_t size, uint32_t type, uint16_t module) {
    (void)type; (void)module; *p = malloc(size); return 0;
}
int rtFree(void *p) { free(p); return 0; }
"""

OLD_CALLS = r"""
ctypes.CDLL("libruntime.so", mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
p, h = c_void_p(), c_void_p()
assert g.rtSetDevice(0) == 0
RESULT = {
    "rtMalloc": g.rtMalloc(byref(p), c_uint64(4096), 2, 0),
    "counted": accounted(),
    "over": g.rtMalloc(byref(p), c_uint64(1 << 20), 2, 0),
    "rtMallocPhysical": g.rtMallocPhysical(byref(h), c_size_t(4096), byref(DrvMemProp(1, 0)), c_uint64(0)),
    "rtModelExecute": g.rtModelExecute(c_void_p(1), None, 0),
}
"""


def test_a_function_the_installed_runtime_lacks_is_a_clean_error(sandbox, tmp_path):
    """An older runtime without the virtual-memory and model functions: the hooks of what exists work and count,
    the others answer ACL_ERROR_RT_FEATURE_NOT_SUPPORT."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "old_runtime.c").write_text(OLD_RUNTIME)
    subprocess.run(
        [sandbox.build.cc, "-shared", "-fPIC", "-o", str(old / "libruntime.so"), str(old / "old_runtime.c")], check=True
    )
    env = sandbox.env(memory="64k")
    env["LD_LIBRARY_PATH"] = str(old)
    result = sandbox.python(OLD_CALLS, env)
    assert result == {
        "rtMalloc": 0,
        "counted": 4096,
        "over": 207001,
        "rtMallocPhysical": NOT_SUPPORTED,
        "rtModelExecute": NOT_SUPPORTED,
    }
