"""Crashes: a process killed anywhere leaves no lock held and no usage behind (hami.testing.isolation's checks,
run against libamvgpu.so and the fake HIP runtime)."""

from __future__ import annotations

from hami.testing.isolation import CrashTests


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "hip = load_hip(); use_device(hip); p = c_void_p()\nassert hip.hipMalloc(byref(p), c_size_t(5 << 20)) == 0\n"
    )
