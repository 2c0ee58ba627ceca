"""libvcorex.so over a CUDA 10.2-level CoreX: what the container sees and what it may do.

- the export list is the hook layer's whole symbol set (a newer CoreX's functions are hooked before it has them,
  so none can pass around the accounting), yet nothing CoreX lacks is invented: dlsym of cuGetProcAddress or of
  the stream-ordered allocator answers NULL, as CoreX itself would;
- IX_DEVICE_MEMORY_LIMIT holds on cuMemAlloc_v2 (over it: CUDA_ERROR_OUT_OF_MEMORY, and CoreX is never asked), and
  cuMemGetInfo_v2, cuDeviceTotalMem_v2 and ixML's nvmlDeviceGetMemoryInfo (libixml.so, NVML's names) report the
  container's view;
- IX_DEVICE_SM_LIMIT keeps the container's share of device time near the limit.
"""

from __future__ import annotations

import pytest

from hami.testing.isolation import SHARE_MEASUREMENT, device_shares, finish

MIB = 1 << 20


def test_the_library_exports_the_layers_hooks_and_nothing_else(build):
    assert build.exported() == build.exports
    assert "cuGetProcAddress" in build.exports
    assert "nvmlDeviceGetMemoryInfo" in build.exports


LOOKUPS = r"""
cuda = load_cuda()
for name in ("cuMemAlloc_v2", "cuMemGetInfo_v2", "cuLaunchKernel", "cuGetProcAddress", "cuMemAllocAsync",
             "cuLaunchKernelEx"):
    RESULT[name] = where(libc.dlsym(cuda._handle, name.encode()))
"""


def test_dlsym_answers_the_hooks_of_what_corex_has_and_null_for_what_it_lacks(sandbox):
    result = sandbox.python(LOOKUPS, sandbox.env(memory=str(64 * MIB)))
    for name in ("cuMemAlloc_v2", "cuMemGetInfo_v2", "cuLaunchKernel"):
        assert result[name] == ["libvcorex.so", name], name
    for name in ("cuGetProcAddress", "cuMemAllocAsync", "cuLaunchKernelEx"):
        assert result[name] == [None, None], f"{name}: CoreX 10.2 has no such function, the library invented one"


MEMORY = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
p, q = c_ulonglong(), c_ulonglong()
RESULT["first"] = cuda.cuMemAlloc_v2(byref(p), c_size_t(48 << 20))
RESULT["over"] = cuda.cuMemAlloc_v2(byref(q), c_size_t(32 << 20))
RESULT["really"] = really_allocated(0)
free, total = c_size_t(), c_size_t()
assert cuda.cuMemGetInfo_v2(byref(free), byref(total)) == 0
RESULT["cuda"] = [free.value, total.value]
device_total = c_size_t()
assert cuda.cuDeviceTotalMem_v2(byref(device_total), 0) == 0
RESULT["device_total"] = device_total.value
ixml = ctypes.CDLL("libixml.so")
assert ixml.nvmlInit_v2() == 0
handle = c_void_p()
assert ixml.nvmlDeviceGetHandleByIndex_v2(0, byref(handle)) == 0
memory = Memory()
assert ixml.nvmlDeviceGetMemoryInfo(handle, byref(memory)) == 0
RESULT["ixml"] = [memory.total, memory.free, memory.used]
assert cuda.cuMemFree_v2(p) == 0
RESULT["after_free"] = accounted(0)
"""


def test_the_memory_limit_holds_and_every_query_reports_the_containers_view(sandbox):
    result = sandbox.python(MEMORY, sandbox.env(memory=str(64 * MIB), extra={"FAKE_CUDA_MEMORY": "16g"}))
    assert result["first"] == 0
    assert result["over"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert result["really"] == 48 * MIB  # the refused 32 MiB never reached CoreX
    assert result["cuda"] == [16 * MIB, 64 * MIB]
    assert result["device_total"] == 64 * MIB
    assert result["ixml"] == [64 * MIB, 16 * MIB, 48 * MIB]
    assert result["after_free"] == 0


def test_without_a_limit_corex_answers_for_itself(sandbox):
    result = sandbox.python(MEMORY, sandbox.env(extra={"FAKE_CUDA_MEMORY": "1g"}))
    assert result["over"] == 0
    assert result["cuda"][1] == 1 << 30
    assert result["ixml"][0] == 1 << 30


def test_the_limit_holds_to_the_byte_under_4_processes_of_4_threads(sandbox):
    # every counted API CoreX has (on a 10.2-level driver the stream-ordered kinds are plain cuMemAlloc_v2)
    limit = 24 * MIB + 4321
    env = sandbox.env(memory=str(limit))
    procs = [sandbox.start("stress", 4, 1500, 6 * MIB, seed, env=env) for seed in range(4)]
    totals = {"ok": 0, "oom": 0}
    for proc in procs:
        for key, value in finish(proc).items():
            totals[key] += value
    device = sandbox.device()
    assert device.peak <= limit, f"CoreX held {device.peak} bytes at once under a {limit}-byte limit"
    assert device.peak > limit - 6 * MIB, "the processes never came near the limit: the test proves nothing"
    assert totals["oom"] > 0
    assert totals["ok"] > 500
    assert device.allocated == 0
    assert sandbox.account().device(0).memory_used == 0


@SHARE_MEASUREMENT
def test_utilization_settles_near_a_30_percent_limit(sandbox):
    env = sandbox.env(cores=30, extra={"FAKE_CUDA_KERNEL_NS": "1000000"})
    proc = sandbox.start("launch", 3.0, "kernel", 132, env=env)
    (share,) = device_shares(sandbox, [0])
    finish(proc)
    assert share == pytest.approx(0.30, abs=0.05), f"the device was {share:.1%} busy under a 30% limit"
    assert sandbox.account().device(0).core_limit == 30
