"""The CUDA-compatible hook layer (core/src/hami/isolation/cuda) for a driver with CUDA's API under another prefix,
and a vendor's own hooks beside the layer's: a scratch vendor (``cuda_layer/``: ``HAMI_CU`` = ``mu##suffix``, no
NVML-compatible library, one hook of its own, ``musaMalloc``) built with core's build.py over the core's fake
driver compiled with ``FAKE_CU_PREFIX=mu``. A process of the container loads the driver and the runtime as an
application would; everything it looks up goes through the library's dlsym."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hami.isolation import build, source_dir
from hami.testing.cuda import FAKE_CUDA
from hami.testing.sandbox import CFLAGS, FAKE_DEVICE, FAKE_STATE_SIZE, NoCompilerError, find_compiler

HERE = Path(__file__).resolve().parent / "cuda_layer"
MIB = 1 << 20

RUNTIME = r"""
#include <stdlib.h>
__attribute__((visibility("default"))) int musaMalloc(void **pointer, size_t bytes) {
    (void)bytes;
    *pointer = malloc(1);
    return *pointer ? 0 : 2;
}
"""

SCRIPT = r"""
import ctypes, json, os, sys
from ctypes import byref, c_size_t, c_ulonglong, c_void_p
libc = ctypes.CDLL(None)
libc.dlsym.restype = c_void_p
libc.dlsym.argtypes = [c_void_p, ctypes.c_char_p]
musa = ctypes.CDLL("libmusa.so.1")
runtime = ctypes.CDLL(os.environ["RUNTIME"], mode=ctypes.RTLD_GLOBAL)
scratch = ctypes.CDLL(os.environ["LIBRARY"])
def ours(handle, name):
    return libc.dlsym(handle, name.encode()) == ctypes.cast(getattr(scratch, name), c_void_p).value
result = {"hooked": {n: ours(musa._handle, n) for n in ("muMemAlloc_v2", "muMemGetInfo_v2", "muInit")},
          "vendor_hook": ours(runtime._handle, "musaMalloc"),
          "cuda_names": libc.dlsym(musa._handle, b"cuMemAlloc_v2")}
assert musa.muInit(0) == 0
ctx = c_void_p()
assert musa.muDevicePrimaryCtxRetain(byref(ctx), 0) == 0
assert musa.muCtxSetCurrent(ctx) == 0
p = c_ulonglong()
result["alloc_12"] = musa.muMemAlloc_v2(byref(p), c_size_t(12 << 20))
result["alloc_8_more"] = musa.muMemAlloc_v2(byref(c_ulonglong()), c_size_t(8 << 20))
free, total = c_size_t(), c_size_t()
assert musa.muMemGetInfo_v2(byref(free), byref(total)) == 0
result["info"] = [free.value, total.value]
pointer = c_void_p()
result["runtime_2"] = runtime.musaMalloc(byref(pointer), c_size_t(2 << 20))
result["runtime_4_more"] = runtime.musaMalloc(byref(pointer), c_size_t(4 << 20))
print(json.dumps(result))
"""

# cuLaunchKernelEx (under the mu prefix) through the layer: the fake driver keeps the config it was handed, its
# address and what it said (fake_cuda.c: fake_cuda_launch_config_at, fake_cuda_launch_config).
LAUNCH_EX = r"""
import ctypes, json
from ctypes import Structure, byref, c_uint, c_void_p
class LaunchConfig(Structure):  # CUDA's CUlaunchConfig
    _fields_ = [("grid", c_uint * 3), ("block", c_uint * 3), ("shared", c_uint), ("stream", c_void_p),
                ("attrs", c_void_p), ("num_attrs", c_uint)]
musa = ctypes.CDLL("libmusa.so.1")
assert musa.muInit(0) == 0
ctx, stream = c_void_p(), c_void_p()
assert musa.muDevicePrimaryCtxRetain(byref(ctx), 0) == 0
assert musa.muCtxSetCurrent(ctx) == 0
assert musa.muStreamCreate(byref(stream), 0) == 0
seen_at = c_void_p.in_dll(musa, "fake_cuda_launch_config_at")
seen = LaunchConfig.in_dll(musa, "fake_cuda_launch_config")
result = {}
for name in ("muLaunchKernelEx", "muLaunchKernelEx_ptsz"):
    config = LaunchConfig((7, 2, 3), (128, 1, 1), 256, stream, None, 0)
    answer = getattr(musa, name)(byref(config), c_void_p(0x1000), None, None)
    result[name] = {"answer": answer, "caller_s_own": seen_at.value == ctypes.addressof(config),
                    "same": bytes(seen) == bytes(config)}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cuda-layer")
    try:
        cc = find_compiler()
    except NoCompilerError as exc:
        pytest.fail(f"the hook layer's test builds C libraries: {exc}")
    spec = build.LibrarySpec(distribution="scratch", package="scratch", library="libscratch.so", what="test library",
                             hooks=HERE, version_script="libscratch.map", layers=("cuda",))  # fmt: skip
    build.compile_library(spec, out / "libscratch.so", source_dir())
    driver = [cc, *CFLAGS, "-DFAKE_CU_PREFIX=mu", "-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic",
              "-Wl,-soname,libmusa.so.1", str(FAKE_CUDA), str(FAKE_DEVICE), "-o",
              str(out / "libmusa.so.1")]  # fmt: skip
    (out / "runtime.c").write_text(RUNTIME)
    runtime = [cc, "-std=c11", "-fPIC", "-shared", "-fvisibility=hidden", str(out / "runtime.c"), "-o",
               str(out / "libmusart.so")]  # fmt: skip
    for argv in (driver, runtime):
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    (out / "fake.state").write_bytes(bytes(FAKE_STATE_SIZE))
    return out


def run(scratch: Path, script: str = SCRIPT, **env: str) -> dict[str, object]:
    environment = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH")},
                   "LD_LIBRARY_PATH": str(scratch), "LD_PRELOAD": str(scratch / "libscratch.so"),
                   "LIBRARY": str(scratch / "libscratch.so"), "RUNTIME": str(scratch / "libmusart.so"),
                   "FAKE_CUDA_STATE": str(scratch / "fake.state"), "FAKE_CUDA_MEMORY": "1g",
                   "SCRATCH_DEVICE_MEMORY_SHARED_CACHE": str(scratch / "accounting.cache"), "SCRATCH_LOG_LEVEL": "0",
                   **env}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_prefixed_driver_is_hooked_and_limited_under_its_own_names(scratch):
    result = run(scratch, SCRATCH_DEVICE_MEMORY_LIMIT_0=str(16 * MIB))
    assert result["hooked"] == {"muMemAlloc_v2": True, "muMemGetInfo_v2": True, "muInit": True}
    assert result["cuda_names"] is None  # the driver has no cu* names, and the library invents none
    assert (result["alloc_12"], result["alloc_8_more"]) == (0, 2)  # 20 MiB > 16 MiB: the API's out of memory
    assert result["info"] == [4 * MIB, 16 * MIB]


def test_a_vendor_hook_is_answered_by_dlsym_and_counted_with_the_driver_hooks(scratch):
    result = run(scratch, SCRATCH_DEVICE_MEMORY_LIMIT_0=str(16 * MIB))
    assert result["vendor_hook"] is True
    assert (result["runtime_2"], result["runtime_4_more"]) == (0, 2)  # 12 + 2 held; 4 more is over 16 MiB


def test_the_driver_runs_a_copy_of_the_launch_config_the_limiter_read(scratch):
    """cuLaunchKernelEx's grid and stream are in the caller's struct: the driver is handed a copy read once, equal
    to the caller's to the byte, not the caller's own memory (which another thread of the tenant could rewrite
    between the limiter's reading and the driver's), with a core limit (the launch timed) as without."""
    for limit in ({}, {"SCRATCH_DEVICE_SM_LIMIT": "30"}):
        result = run(scratch, LAUNCH_EX, **limit)
        for name in ("muLaunchKernelEx", "muLaunchKernelEx_ptsz"):
            assert result[name] == {"answer": 0, "caller_s_own": False, "same": True}, (name, limit)
