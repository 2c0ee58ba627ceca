"""The linker's other doors, tried by a process of the container under an 8 MiB limit: dlvsym with any version
string, dlsym of dlsym itself, a library loaded with RTLD_DEEPBIND: each answers libvgpu.so's hook, and 32 MiB is
refused (nothing reaches the device); dlmopen into a new namespace is refused (hami.testing.isolation.LookupTests)."""

from __future__ import annotations

import json

from hami.testing.isolation import LookupTests

MIB = 1 << 20
VERSIONS = ["GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", "", "NO_SUCH_VERSION"]

THROUGH_DLVSYM = r"""
libc.dlvsym.restype = c_void_p
libc.dlvsym.argtypes = [c_void_p, c_char_p, c_char_p]
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
libc_handle = ctypes.CDLL("libc.so.6")._handle
lookup = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_char_p)
for version in json.loads(os.environ["VERSIONS"]):
    found = libc.dlvsym(None, b"dlsym", version.encode())
    dlsym_ = lookup(found)
    alloc = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t)(dlsym_(cuda._handle, b"cuMemAlloc_v2"))
    p = c_ulonglong()
    RESULT[version] = {"dlsym": where(found), "alloc": alloc(byref(p), 32 << 20),
                       "dlvsym": where(libc.dlvsym(libc_handle, b"dlvsym", version.encode())),
                       "hook": where(libc.dlvsym(cuda._handle, b"cuMemAlloc_v2", version.encode()))}
for name in ("dlsym", "dlvsym", "dlopen", "dlmopen"):
    RESULT[name] = where(libc.dlsym(libc_handle, name.encode()))
RESULT["held"] = really_allocated()
"""


def test_dlvsym_of_any_version_and_dlsym_of_the_dl_functions_answer_the_hooks(sandbox):
    env = sandbox.env(memory=str(8 * MIB), extra={"VERSIONS": json.dumps(VERSIONS)})
    result = sandbox.python(THROUGH_DLVSYM, env)
    for version in VERSIONS:
        assert result[version] == {
            "dlsym": ["libvgpu.so", "dlsym"],
            "alloc": 2,  # CUDA_ERROR_OUT_OF_MEMORY: 32 MiB over the 8 MiB limit
            "dlvsym": ["libvgpu.so", "dlvsym"],
            "hook": ["libvgpu.so", "cuMemAlloc_v2"],
        }, version
    for name in ("dlsym", "dlvsym", "dlopen", "dlmopen"):
        assert result[name] == ["libvgpu.so", name]
    assert result["held"] == 0
    assert sandbox.device().peak == 0


DEEPBIND = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
deep = ctypes.CDLL(os.environ["DEEP"], mode=os.RTLD_NOW | os.RTLD_DEEPBIND)
deep.deep_lookup.restype = c_void_p
deep.deep_lookup.argtypes = [c_void_p, c_char_p]
found = deep.deep_lookup(cuda._handle, b"cuMemAlloc_v2")
p = c_ulonglong()
RESULT = {"found": where(found),
          "alloc": ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t)(found)(byref(p), 32 << 20)}
"""


def test_a_library_loaded_with_deepbind_still_reaches_the_hooks(sandbox):
    env = sandbox.env(memory=str(8 * MIB), extra={"DEEP": str(sandbox.build.built("libdeep.so"))})
    result = sandbox.python(DEEPBIND, env)
    assert result == {"found": ["libvgpu.so", "cuMemAlloc_v2"], "alloc": 2}
    assert sandbox.device().peak == 0


class TestLookups(LookupTests):
    driver_library = "libcuda.so.1"
    allocator = ("libcuda.so.1", "cuMemAlloc_v2")
    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY
    allocate = "lambda a, n: ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_size_t)(a)(byref(c_ulonglong()), n)"
    prepare = "cuda = load_cuda(); assert cuda.cuInit(0) == 0; use_device(cuda)"
