"""The checks every isolation library passes (hami.testing.isolation), against libvmlu.so over the fake CNDrv and
CNRT: crashes anywhere (even inside the accounting lock) leave nothing held, hundreds of processes start at once
with their limits on, the node's grant cannot be lifted from inside the container, the linker's other doors
(dlvsym, dlmopen) are closed, and the node monitor reads the library's accounting of a served container."""

from __future__ import annotations

from hami.testing.isolation import CrashTests, GrantTests, LookupTests, MonitorTests, StartupTests


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "rt = load_cnrt(); use_device(rt); p = c_void_p()\nassert rt.cnrtMalloc(byref(p), c_size_t(5 << 20)) == 0\n"
    )


class TestStartup(StartupTests):
    pass


class TestGrant(GrantTests):
    policy_variable = "CAMBRICON_CORE_UTILIZATION_POLICY"
    out_of_memory = 100100  # cnrtErrorNoMem


class TestLookups(LookupTests):
    driver_library = "libcndrv.so"
    allocator = ("libcndrv.so", "cnMalloc")
    out_of_memory = 100100  # CN_MEMORY_ERROR_OUT_OF_MEMORY
    allocate = "lambda a, n: ctypes.CFUNCTYPE(c_int, POINTER(c_uint64), c_uint64)(a)(byref(c_uint64()), n)"
    prepare = "use_device(load_cnrt())"


class TestMonitor(MonitorTests):
    kind = "MLU"
    uuid_variable = "CAMBRICON_DEVICE_UUIDS"
    device_uuid = "MLU-a1b2c3d4-0000-0000-0000-000000000000"
    kernel_ns_variable = "FAKE_MLU_KERNEL_NS"
    launch_mode = "rt"
