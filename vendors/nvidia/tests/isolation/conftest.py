"""The isolation tests' sandbox for NVIDIA: the installed libvgpu.so in front of fake drivers built here.

hami.testing.sandbox does the work; this file says what is NVIDIA's: ``libvgpu.so`` inside the installed
``hami_vendor_nvidia`` package, the fake CUDA driver (``libcuda.so.1``) and minimal fake NVML
(``libnvidia-ml.so.1``) over hami.testing's fake device, the client program the tests and the benchmark drive, two
tiny libraries for the RTLD_NEXT check, the CUDA_* variables, and the ctypes prelude. `build` (once per session)
compiles them; `sandbox` (per test) is a hami.testing.sandbox.Sandbox.

To run the same tests against a real GPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real
``libcuda.so.1``/``libnvidia-ml.so.1`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.sandbox import (
    FAKE_DEVICE,
    ISOLATION_CLIENT,
    CTarget,
    IsolationSetup,
    fake_library,
    fixtures,
)

HERE = Path(__file__).resolve().parent

# Every function libvgpu.so hooks: the contract of its export list and of its three ways in.
CUDA_HOOKS = (
    "cuInit",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxReset_v2",
)
NVML_HOOKS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")


# Before every ctypes script (after hami.testing.sandbox's own start): the CUDA driver as an application sees it
# (with libvgpu.so preloaded, every symbol looked up here goes through its dlsym), a context on device 0, and small
# helpers.
PRELUDE = r"""
libc = ctypes.CDLL(None)
libc.dlsym.restype = c_void_p
libc.dlsym.argtypes = [c_void_p, c_char_p]

class DlInfo(Structure):
    _fields_ = [("fname", c_char_p), ("fbase", c_void_p), ("sname", c_char_p), ("saddr", c_void_p)]

libc.dladdr.argtypes = [c_void_p, POINTER(DlInfo)]

def where(address):
    info = DlInfo()
    if not address or not libc.dladdr(address, byref(info)):
        return [None, None]
    return [os.path.basename(info.fname.decode()), info.sname.decode() if info.sname else None]

def load_cuda():
    return ctypes.CDLL("libcuda.so.1")

class Location(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class AllocProp(Structure):
    _fields_ = [("type", c_int), ("handle_types", c_int), ("location", Location), ("win32", c_void_p),
                ("flags", ctypes.c_ubyte * 8)]

class PoolProps(Structure):
    _fields_ = [("alloc_type", c_int), ("handle_types", c_int), ("location", Location), ("win32", c_void_p),
                ("max_size", c_size_t), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]

class ArrayDesc(Structure):
    _fields_ = [("width", c_size_t), ("height", c_size_t), ("format", c_int), ("channels", c_uint)]

class Array3DDesc(Structure):
    _fields_ = [("width", c_size_t), ("height", c_size_t), ("depth", c_size_t), ("format", c_int),
                ("channels", c_uint), ("flags", c_uint)]

class Memory(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]

class MemoryV2(Structure):
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong), ("free", c_ulonglong),
                ("used", c_ulonglong)]

def use_device(cuda, device=0):
    ctx = c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(byref(ctx), device) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    return ctx
"""


SETUP = IsolationSetup(
    package="hami_vendor_nvidia",
    library="libvgpu.so",
    project=HERE.parents[1],
    fakes=(
        fake_library("libcuda.so.1", HERE / "fake_cuda.c", FAKE_DEVICE),
        fake_library("libnvidia-ml.so.1", HERE / "fake_nvml.c", FAKE_DEVICE),
    ),
    client=CTarget("client", (HERE / "client.c", ISOLATION_CLIENT), link=("-L{build}", "-l:libcuda.so.1")),
    helpers=(
        CTarget("libinterposed.so", (HERE / "interposed.c",), ("-fPIC", "-shared")),
        CTarget("libinterposer.so", (HERE / "interposer.c",), ("-fPIC", "-shared"), ("-ldl",)),
        CTarget("libdeep.so", (HERE / "deep.c",), ("-fPIC", "-shared"), ("-ldl",)),
    ),
    exports=frozenset({"dlsym", "dlvsym", "dlopen", "dlmopen", *CUDA_HOOKS, *NVML_HOOKS}),
    hooks={"cuda": CUDA_HOOKS, "nvml": NVML_HOOKS},
    fake_prefix="FAKE_CUDA_",
    memory_limit_variable="CUDA_DEVICE_MEMORY_LIMIT",
    core_limit_variable="CUDA_DEVICE_SM_LIMIT",
    accounting_variable="CUDA_DEVICE_MEMORY_SHARED_CACHE",
    log_level_variable="LIBCUDA_LOG_LEVEL",
    prelude=PRELUDE,
)


build, sandbox = fixtures(SETUP)
