"""The linker's doors the core closes, tried by a process of the container (hami.testing.isolation.LookupTests)."""

from __future__ import annotations

from hami.testing.isolation import LookupTests


class TestLookups(LookupTests):
    driver_library = "libascendcl.so"
    allocator = ("libruntime.so", "rtMalloc")
    out_of_memory = 207001  # ACL_ERROR_RT_MEMORY_ALLOCATION
    # rtMalloc(void **devPtr, uint64_t size, rtMemType_t type, uint16_t moduleId), device memory (type 2)
    allocate = (
        "lambda a, n: ctypes.CFUNCTYPE(c_int, POINTER(c_void_p), c_uint64, c_uint32, ctypes.c_uint16)(a)"
        "(byref(c_void_p()), n, 2, 0)"
    )
    prepare = "use_device(load_acl())"
