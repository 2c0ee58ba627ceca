"""The checks every isolation library passes (hami.testing.isolation), against libvmusa.so and the fake MUSA: crashes
anywhere (even inside the accounting lock) leave nothing held, hundreds of processes start at once with their limits
on, the node's grant cannot be lifted from inside the container, and the linker's other doors (dlvsym, dlmopen) are
closed; the node monitor reads the library's accounting of a served container."""

from __future__ import annotations

from hami.testing.isolation import CrashTests, GrantTests, LookupTests, MonitorTests, StartupTests


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "cuda = load_cuda(); cuda.muInit(0); use_device(cuda); p = c_ulonglong()\n"
        "assert cuda.muMemAlloc_v2(byref(p), c_size_t(5 << 20)) == 0\n"
    )


class TestStartup(StartupTests):
    pass


class TestGrant(GrantTests):
    policy_variable = "MUSA_CORE_UTILIZATION_POLICY"
    out_of_memory = 2  # MUSA_ERROR_OUT_OF_MEMORY


class TestLookups(LookupTests):
    driver_library = "libmusa.so.1"
    allocator = ("libmusart.so", "musaMalloc")
    out_of_memory = 2  # musaErrorMemoryAllocation


class TestMonitor(MonitorTests):
    kind = "Mthreads"
    uuid_variable = "MUSA_DEVICE_UUIDS"
    device_uuid = "0c8e1a2b-0000-4000-8000-000000000000"
    kernel_ns_variable = "FAKE_CUDA_KERNEL_NS"
