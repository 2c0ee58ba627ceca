"""The isolation test kit of a library built on the core's CUDA-compatible hook layer (hami/isolation/cuda).

What every such vendor's tests share, beyond `hami.testing.sandbox` and `hami.testing.isolation`: the fake
CUDA-compatible driver (``csrc/fake_cuda.c``: any driver file name, CUDA's names or another prefix, the API up to
a chosen CUDA version), the fake NVML-compatible management library (``csrc/fake_nvml.c``), the client program's
CUDA side (``csrc/cuda_client.c``), the lists of functions the layer hooks, and the ctypes prelude of
`Sandbox.python` scripts. A vendor's isolation conftest is then::

    SETUP = cuda_isolation_setup(
        package="hami_vendor_myvendor", library="libvmy.so", project=HERE.parents[1],
        driver="libcuda.so.1", management="libmyml.so", env_prefix="MY", cuda_version=10020,
    )
    build, sandbox = fixtures(SETUP)

`LaunchKernelExTests` is the check of a library whose driver has cuLaunchKernelEx (CUDA 11.6 on; a vendor's test
module subclasses it only then, as `hami.testing.rt.LaunchConfigTests` is subclassed only where the runtime has
the launch-config launch): a tenant launching through it is throttled as through cuLaunchKernel.

Nothing here names a vendor.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from hami.testing.isolation import SHARE_MEASUREMENT, device_shares, finish
from hami.testing.sandbox import CSRC, FAKE_DEVICE, ISOLATION_CLIENT, CTarget, IsolationSetup, Sandbox, fake_library

__all__ = [
    "CUDA_CLIENT",
    "CUDA_HOOKS",
    "CUDA_HOOKS_SINCE",
    "FAKE_CUDA",
    "FAKE_NVML",
    "LaunchKernelExTests",
    "NVML_HOOKS",
    "PRELUDE",
    "cuda_hooks",
    "cuda_isolation_setup",
]

FAKE_CUDA = CSRC / "fake_cuda.c"  # the fake driver (FAKE_CUDA_* variables, fake_device.h)
FAKE_NVML = CSRC / "fake_nvml.c"  # the fake NVML-compatible management library (memory, per-process utilization)
CUDA_CLIENT = CSRC / "cuda_client.c"  # the client's CUDA calls (with ISOLATION_CLIENT)

# Every function the layer hooks (hami/isolation/cuda/hami_cuda.h), by CUDA's name.
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

# The CUDA version that introduced each hooked function newer than CUDA 10.2 (what the fake driver leaves out when
# built for an older version, as such a driver would not have it).
CUDA_HOOKS_SINCE = {
    "cuGetProcAddress": 11030,
    "cuGetProcAddress_v2": 12000,
    "cuMemAllocAsync": 11020,
    "cuMemAllocAsync_ptsz": 11020,
    "cuMemFreeAsync": 11020,
    "cuMemFreeAsync_ptsz": 11020,
    "cuMemAllocFromPoolAsync": 11020,
    "cuMemAllocFromPoolAsync_ptsz": 11020,
    "cuMemPoolCreate": 11020,
    "cuMemPoolDestroy": 11020,
    "cuLaunchKernelEx": 11060,
    "cuLaunchKernelEx_ptsz": 11060,
    "cuCtxCreate_v3": 11040,
    "cuCtxCreate_v4": 12050,
    "cuDevicePrimaryCtxReset_v2": 11000,
}


def cuda_hooks(cuda_version: int | None = None, prefix: str = "cu") -> tuple[str, ...]:
    """The hooked functions a driver of `cuda_version` (None: the newest) has, under its `prefix`."""
    names = (n for n in CUDA_HOOKS if cuda_version is None or CUDA_HOOKS_SINCE.get(n, 0) <= cuda_version)
    return tuple(prefix + n.removeprefix("cu") for n in names)


# Before every ctypes script (after hami.testing.sandbox's own start): the driver as an application sees it (with
# the isolation library preloaded, every symbol looked up here goes through its dlsym), helpers to make a device
# current, and the structures of the counted APIs. DRIVER is the driver's file name and PREFIX its functions' prefix
# (set by `cuda_isolation_setup`).
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
    return ctypes.CDLL(DRIVER)

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

def cu(library, suffix):  # the driver's function cu<suffix>, under the driver's prefix
    return getattr(library, PREFIX + suffix)

def use_device(cuda, device=0):
    ctx = c_void_p()
    assert cu(cuda, "DevicePrimaryCtxRetain")(byref(ctx), device) == 0
    assert cu(cuda, "CtxSetCurrent")(ctx) == 0
    return ctx
"""


def cuda_isolation_setup(
    *,
    package: str,
    library: str,
    project: Path,
    driver: str = "libcuda.so.1",
    management: str | None = "libnvidia-ml.so.1",
    env_prefix: str = "CUDA",
    memory_limit_variable: str | None = None,
    core_limit_variable: str | None = None,
    accounting_variable: str | None = None,
    log_level_variable: str | None = None,
    cuda_version: int | None = None,
    prefix: str = "cu",
    helpers: Iterable[CTarget] = (),
    fake_prefix: str = "FAKE_CUDA_",
) -> IsolationSetup:
    """The sandbox setup of a library on the CUDA-compatible hook layer: the fake driver built as `driver` (the API
    up to `cuda_version`, names with `prefix`), the fake management library as `management` (None: none, and no
    NVML hooks), the client linked against the driver, the export list (dlsym, the core's doors and every hook of
    the layer: a newer driver's functions are hooked before the driver has them, so none can pass unaccounted),
    the hooks the tests exercise (those the driver of `cuda_version` has) and the variables
    (``<env_prefix>_DEVICE_MEMORY_LIMIT`` ..., each may be named instead, as the vendor's hami_cuda_vendor.h
    does)."""
    defines: tuple[str, ...] = (f"-DFAKE_CU_PREFIX={prefix}",)
    if cuda_version is not None:
        defines += (f"-DFAKE_CUDA_VERSION={cuda_version}",)
    driver_fake = fake_library(driver, FAKE_CUDA, FAKE_DEVICE)
    fakes = [CTarget(driver_fake.output, driver_fake.sources, (*defines, *driver_fake.flags), driver_fake.link)]
    if management is not None:
        fakes.append(fake_library(management, FAKE_NVML, FAKE_DEVICE))
    hooks = cuda_hooks(cuda_version, prefix)
    management_hooks = NVML_HOOKS if management is not None else ()
    client = CTarget("client", (CUDA_CLIENT, ISOLATION_CLIENT), defines, link=("-L{build}", f"-l:{driver}"))
    return IsolationSetup(
        package=package,
        library=library,
        project=project,
        fakes=tuple(fakes),
        client=client,
        helpers=tuple(helpers),
        exports=frozenset({"dlsym", "dlvsym", "dlopen", "dlmopen", *cuda_hooks(None, prefix), *management_hooks}),
        hooks={"cuda": hooks, **({"nvml": management_hooks} if management_hooks else {})},
        fake_prefix=fake_prefix,
        memory_limit_variable=memory_limit_variable or f"{env_prefix}_DEVICE_MEMORY_LIMIT",
        core_limit_variable=core_limit_variable or f"{env_prefix}_DEVICE_SM_LIMIT",
        accounting_variable=accounting_variable or f"{env_prefix}_DEVICE_MEMORY_SHARED_CACHE",
        log_level_variable=log_level_variable or f"{env_prefix}_LOG_LEVEL",
        prelude=f"DRIVER = {driver!r}\nPREFIX = {prefix!r}\n" + PRELUDE,
    )


class LaunchKernelExTests:
    """What a tenant tries with the launch-config launch, cuLaunchKernelEx (the grid, block and stream in a
    struct, CUDA 11.6 on; the client's ``ex`` launch mode): calling it instead of cuLaunchKernel to get its kernels
    past its core limit. It fails: the layer hooks it through the same compute limiter, and the container's device
    share stays at its 30 % limit, within the same tolerance as for cuLaunchKernel (the plain launch is measured
    beside it, in the same way). A vendor's test module subclasses this class where its driver has the function."""

    @SHARE_MEASUREMENT
    @pytest.mark.parametrize("entry", ["LaunchKernel", "LaunchKernelEx"])
    def test_a_tenant_launching_through_launch_kernel_ex_is_throttled_as_through_launch_kernel(
        self, sandbox: Sandbox, entry: str
    ) -> None:
        # the client falls back to cuLaunchKernel on a driver without cuLaunchKernelEx: that would measure nothing
        assert any(name.endswith("LaunchKernelEx") for name in sandbox.build.hooks["cuda"]), (
            "this vendor's driver has no cuLaunchKernelEx: do not subclass LaunchKernelExTests"
        )
        mode = {"LaunchKernel": "kernel", "LaunchKernelEx": "ex"}[entry]
        extra = {sandbox.setup.fake_prefix + "KERNEL_NS": "1000000"}  # 1 ms kernels, as the plain-launch check
        proc = sandbox.start("launch", "3.0", mode, 132, env=sandbox.env(cores=30, extra=extra))
        (share,) = device_shares(sandbox, [0])
        finish(proc)
        name = "cu" + entry  # by CUDA's name
        assert share == pytest.approx(0.30, abs=0.05), f"{name}: the device was {share:.1%} busy under a 30% limit"
        device = sandbox.account().device(0)
        assert device.core_limit == 30
        assert device.launches > 0, f"the limiter never saw a launch through {name}"
        assert device.device_time_ns > 0
