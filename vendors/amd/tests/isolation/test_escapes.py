"""The linker's doors the core closes, tried by a process of the container (hami.testing.isolation.LookupTests):
hipMalloc looked up in the runtime opened privately (dlsym, dlvsym, RTLD_DEEPBIND) is the hook, and dlmopen into a
new namespace is refused."""

from __future__ import annotations

from hami.testing.isolation import LookupTests


class TestLookups(LookupTests):
    driver_library = "libamdhip64.so"
    allocator = ("libamdhip64.so", "hipMalloc")
    out_of_memory = 2  # hipErrorOutOfMemory
    prepare = "use_device(load_hip())"
