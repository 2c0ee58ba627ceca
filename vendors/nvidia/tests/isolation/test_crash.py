"""Crashes: a process killed anywhere (even inside the accounting lock) leaves no lock held and no usage behind,
and after hundreds of kills a new process starts at once with its limits on (hami.testing.isolation's checks, run
against libvgpu.so and the fake CUDA driver)."""

from __future__ import annotations

from hami.testing.isolation import CrashTests


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "cuda = load_cuda(); cuda.cuInit(0); use_device(cuda); p = c_ulonglong()\n"
        "assert cuda.cuMemAlloc_v2(byref(p), c_size_t(5 << 20)) == 0\n"
    )
