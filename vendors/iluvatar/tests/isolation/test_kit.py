"""The checks every isolation library passes (hami.testing.isolation), against libvcorex.so and the fake CoreX:
crashes anywhere (even inside the accounting lock) leave nothing held, hundreds of processes start at once with
their limits on, the node's grant cannot be lifted from inside the container, each process's context memory
counts against the limit, the linker's other doors (dlvsym, dlmopen) are closed, and a process that zeroes the
accounting file is refused by what it holds and by ixML's (NVML-compatible) per-process memory."""

from __future__ import annotations

from hami.testing.isolation import (
    ContextMemoryTests,
    CrashTests,
    GrantTests,
    LookupTests,
    StartupTests,
    TamperTests,
)


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "cuda = load_cuda(); cuda.cuInit(0); use_device(cuda); p = c_ulonglong()\n"
        "assert cuda.cuMemAlloc_v2(byref(p), c_size_t(5 << 20)) == 0\n"
    )


class TestStartup(StartupTests):
    pass


class TestGrant(GrantTests):
    policy_variable = "IX_CORE_UTILIZATION_POLICY"
    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY


class TestLookups(LookupTests):
    driver_library = "libcuda.so.1"
    allocator = ("libcuda.so.1", "cuMemAlloc_v2")
    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY
    allocate = "lambda a, n: ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t)(a)(byref(c_ulonglong()), n)"
    prepare = "cuda = load_cuda(); assert cuda.cuInit(0) == 0; use_device(cuda)"


class TestContextMemory(ContextMemoryTests):
    driver_library = "libcuda.so.1"
    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY


class TestTamper(TamperTests):
    pass
