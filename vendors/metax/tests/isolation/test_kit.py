"""hami.testing.isolation's shared checks against libvmaca.so and the fake MACA runtime: limits from the node's grant
that no process can lift, crashes that leave no lock or usage behind, hundreds of processes starting together."""

from __future__ import annotations

from hami.testing.isolation import CrashTests, GrantTests, LookupTests, StartupTests


class TestGrant(GrantTests):
    policy_variable = "MACA_CORE_UTILIZATION_POLICY"
    out_of_memory = 2  # mcErrorMemoryAllocation


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "mc = load_maca(); use_device(mc); p = c_void_p()\nassert mc.mcMalloc(byref(p), c_size_t(5 << 20)) == 0\n"
    )


class TestStartup(StartupTests):
    pass


class TestLookups(LookupTests):
    driver_library = "libmcruntime.so"
    allocator = ("libmcruntime.so", "mcMalloc")
    out_of_memory = 2  # mcErrorMemoryAllocation
