"""Crashes: a process killed anywhere (even inside the accounting lock) leaves no lock held and no usage behind,
and after hundreds of kills a new process starts at once with its limits on (hami.testing.isolation's checks, run
against libvnpu.so and the fake Ascend stack)."""

from __future__ import annotations

from hami.testing.isolation import CrashTests


class TestCrashes(CrashTests):
    allocate_5_mib = (
        "acl = load_acl(); use_device(acl); p = c_void_p()\n"
        "assert acl.aclrtMallocAlign32(byref(p), c_size_t(5 << 20), 0) == 0\n"
    )
