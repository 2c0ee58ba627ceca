"""The three ways into the driver all lead through libvgpu.so: exported symbols, dlsym, and cuGetProcAddress (by
name, CUDA version and per-thread-stream flag); the export list is exactly the hooks; without a driver every hook
fails cleanly."""

from __future__ import annotations

import ctypes.util
import json

import pytest

LOOKUPS = r"""
names = json.loads(os.environ["NAMES"])
cuda, nvml = load_cuda(), ctypes.CDLL("libnvidia-ml.so.1")
for name in names:
    library = cuda if name.startswith("cu") else nvml
    RESULT[name] = {"library": where(libc.dlsym(library._handle, name.encode())),
                    "default": where(libc.dlsym(None, name.encode())),
                    "attribute": where(ctypes.cast(getattr(library, name), c_void_p).value)}
"""


def test_the_library_exports_exactly_its_hooks(build):
    assert build.exported() == build.exports


def test_dlsym_answers_the_hook_for_every_hooked_name(sandbox):
    names = [*sandbox.build.hooks["cuda"], *sandbox.build.hooks["nvml"]]
    result = sandbox.python(LOOKUPS, sandbox.env(extra={"NAMES": json.dumps(names)}))
    for name in names:
        for way, found in result[name].items():
            assert found == ["libvgpu.so", name], f"dlsym ({way}) of {name} found {found}"


PROC_ADDRESS = r"""
cases = json.loads(os.environ["CASES"])
cuda = load_cuda()
assert cuda.cuInit(0) == 0
prototype = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_ulonglong)
prototype_v2 = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_ulonglong, POINTER(c_int))
v1 = prototype(libc.dlsym(cuda._handle, b"cuGetProcAddress"))
# the way CUDA 12 runtimes do it: ask the driver for cuGetProcAddress itself, then ask that for everything
entry = c_void_p()
assert v1(b"cuGetProcAddress", byref(entry), 12000, 0) == 0
v2 = prototype_v2(entry.value)
for name, version, flags in cases:
    found, status = c_void_p(), c_int(-1)
    r1 = v1(name.encode(), byref(found), version, flags)
    by_v1 = where(found.value) if r1 == 0 else r1
    r2 = v2(name.encode(), byref(found), version, flags, byref(status))
    by_v2 = where(found.value) if r2 == 0 else r2
    RESULT[f"{name}@{version}/{flags}"] = [by_v1, by_v2, where(entry.value)]
"""

PER_THREAD = 2
CASES = [  # (name, CUDA version, flags) -> the exported variant the driver hands out
    ("cuInit", 12000, 0, "cuInit"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
    ("cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"),
    ("cuMemAllocManaged", 12000, 0, "cuMemAllocManaged"),
    ("cuMemFree", 12000, 0, "cuMemFree_v2"),
    ("cuMemCreate", 12000, 0, "cuMemCreate"),
    ("cuMemRelease", 12000, 0, "cuMemRelease"),
    ("cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"),
    ("cuMemAllocAsync", 12000, PER_THREAD, "cuMemAllocAsync_ptsz"),
    ("cuMemFreeAsync", 12000, 0, "cuMemFreeAsync"),
    ("cuMemFreeAsync", 12000, PER_THREAD, "cuMemFreeAsync_ptsz"),
    ("cuMemAllocFromPoolAsync", 12000, 0, "cuMemAllocFromPoolAsync"),
    ("cuMemAllocFromPoolAsync", 12000, PER_THREAD, "cuMemAllocFromPoolAsync_ptsz"),
    ("cuMemPoolCreate", 12000, 0, "cuMemPoolCreate"),
    ("cuMemPoolDestroy", 12000, 0, "cuMemPoolDestroy"),
    ("cuArrayCreate", 12000, 0, "cuArrayCreate_v2"),
    ("cuArray3DCreate", 12000, 0, "cuArray3DCreate_v2"),
    ("cuArrayDestroy", 12000, 0, "cuArrayDestroy"),
    ("cuMipmappedArrayCreate", 12000, 0, "cuMipmappedArrayCreate"),
    ("cuMipmappedArrayDestroy", 12000, 0, "cuMipmappedArrayDestroy"),
    ("cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"),
    ("cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2"),
    ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 12000, PER_THREAD, "cuLaunchKernel_ptsz"),
    ("cuLaunchKernelEx", 12000, 0, "cuLaunchKernelEx"),
    ("cuLaunchKernelEx", 12000, PER_THREAD, "cuLaunchKernelEx_ptsz"),
    ("cuLaunchCooperativeKernel", 12000, 0, "cuLaunchCooperativeKernel"),
    ("cuLaunchCooperativeKernel", 12000, PER_THREAD, "cuLaunchCooperativeKernel_ptsz"),
    ("cuGraphLaunch", 12000, 0, "cuGraphLaunch"),
    ("cuGraphLaunch", 12000, PER_THREAD, "cuGraphLaunch_ptsz"),
    ("cuCtxCreate", 11000, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
    ("cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2"),
    ("cuCtxSetCurrent", 12000, 0, "cuCtxSetCurrent"),
    ("cuCtxPushCurrent", 12000, 0, "cuCtxPushCurrent_v2"),
    ("cuCtxPopCurrent", 12000, 0, "cuCtxPopCurrent_v2"),
    ("cuDevicePrimaryCtxRetain", 12000, 0, "cuDevicePrimaryCtxRetain"),
    ("cuDevicePrimaryCtxReset", 12000, 0, "cuDevicePrimaryCtxReset_v2"),
]


@pytest.mark.parametrize("addresses", ["exported", "internal"])
def test_cuGetProcAddress_answers_the_hook_for_every_name_version_and_stream_flag(sandbox, addresses):  # noqa: N802
    """`internal`: the driver hands out addresses that are not its exported symbols (the hooks are then found by
    name and version)."""
    extra = {"CASES": json.dumps([c[:3] for c in CASES])}
    if addresses == "internal":
        extra["FAKE_CUDA_PRIVATE_PROCS"] = "1"
    result = sandbox.python(PROC_ADDRESS, sandbox.env(extra=extra))
    hooked = {hook for *_, hook in CASES}
    assert hooked == set(sandbox.build.hooks["cuda"]), "every hooked function has a case"
    for name, version, flags, variant in CASES:
        v1, v2, entry = result[f"{name}@{version}/{flags}"]
        assert v1 == ["libvgpu.so", variant], f"cuGetProcAddress({name}, {version}, {flags}) gave {v1}"
        assert v2 == ["libvgpu.so", variant], f"cuGetProcAddress_v2({name}, {version}, {flags}) gave {v2}"
        assert entry == ["libvgpu.so", "cuGetProcAddress_v2"]


UNHOOKED = r"""
cuda = load_cuda()
prototype = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_ulonglong)
v1 = prototype(libc.dlsym(cuda._handle, b"cuGetProcAddress"))
found = c_void_p()
RESULT["cuStreamCreate"] = where(found.value) if v1(b"cuStreamCreate", byref(found), 12000, 0) == 0 else None
RESULT["too_old"] = v1(b"cuLaunchKernelEx", byref(found), 11000, 0)
RESULT["unknown"] = v1(b"cuNoSuchFunction", byref(found), 12000, 0)
"""


def test_cuGetProcAddress_leaves_unhooked_functions_and_errors_alone(sandbox):  # noqa: N802
    result = sandbox.python(UNHOOKED, sandbox.env())
    assert result == {"cuStreamCreate": ["libcuda.so.1", "cuStreamCreate"], "too_old": 500, "unknown": 500}


def test_dlsym_with_rtld_next_still_means_after_the_caller(sandbox):
    """Another preloaded library that wraps a function with dlsym(RTLD_NEXT, ...) must reach the next definition,
    not itself: libvgpu.so's dlsym passes such lookups on without becoming the caller."""
    env = sandbox.env()
    build = sandbox.build
    env["LD_PRELOAD"] = f"{build.library} {build.built('libinterposer.so')} {build.built('libinterposed.so')}"
    result = sandbox.python("RESULT['probe'] = libc.hami_probe()", env)
    assert result == {"probe": 101}


MISSING = r"""
lookup = lambda name: libc.dlsym(None, name.encode())
call = lambda name, *args: ctypes.CFUNCTYPE(c_int, *[type(a) for a in args])(lookup(name))(*args)
p, free, total = c_ulonglong(), c_size_t(), c_size_t()
RESULT = {
    "cuInit": call("cuInit", c_uint(0)),
    "cuMemAlloc_v2": call("cuMemAlloc_v2", ctypes.pointer(p), c_size_t(1 << 20)),
    "cuMemGetInfo_v2": call("cuMemGetInfo_v2", ctypes.pointer(free), ctypes.pointer(total)),
    "cuLaunchKernel": ctypes.CFUNCTYPE(c_int, *[c_void_p] + [c_uint] * 7 + [c_void_p] * 3)(lookup("cuLaunchKernel"))(
        None, 1, 1, 1, 1, 1, 1, 0, None, None, None),
    "cuGetProcAddress": call("cuGetProcAddress", c_char_p(b"cuInit"), ctypes.pointer(c_void_p()), c_int(12000),
                             c_ulonglong(0)),
    "nvmlDeviceGetMemoryInfo": call("nvmlDeviceGetMemoryInfo", c_void_p(1), ctypes.pointer(Memory())),
    "nvmlDeviceGetMemoryInfo_v2": call("nvmlDeviceGetMemoryInfo_v2", c_void_p(1), ctypes.pointer(MemoryV2())),
}
"""


def test_without_a_driver_every_hook_fails_cleanly(sandbox):
    if ctypes.util.find_library("cuda") or ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real CUDA driver or NVML")
    env = sandbox.env()
    env["LD_LIBRARY_PATH"] = str(sandbox.root)  # no libcuda.so.1, no libnvidia-ml.so.1
    result = sandbox.python(MISSING, env)
    not_initialized, library_not_found = 3, 12
    assert result == {
        "cuInit": not_initialized,
        "cuMemAlloc_v2": not_initialized,
        "cuMemGetInfo_v2": not_initialized,
        "cuLaunchKernel": not_initialized,
        "cuGetProcAddress": not_initialized,
        "nvmlDeviceGetMemoryInfo": library_not_found,
        "nvmlDeviceGetMemoryInfo_v2": library_not_found,
    }
