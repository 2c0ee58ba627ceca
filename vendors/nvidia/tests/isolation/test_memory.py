"""Memory isolation: limits hold to the byte across processes and threads, every allocating API is counted, frees
give back exactly what was counted, and the queries tell the container's view."""

from __future__ import annotations

import json

import pytest

MIB = 1 << 20


def test_limit_holds_to_the_byte_under_16_processes_of_8_threads(sandbox):
    """16 processes x 8 threads allocate through every API and free at random under one odd-sized limit: what the
    (fake) hardware really held never exceeds the limit, and everything is given back when they exit."""
    limit = 48 * MIB + 12345
    env = sandbox.env(memory=str(limit))
    procs = [sandbox.start("stress", 8, 3000, 6 * MIB, seed, env=env) for seed in range(16)]
    totals = {"ok": 0, "oom": 0}
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"a stress process failed:\n{out}\n{err}"
        for key, value in json.loads(out.strip().splitlines()[-1]).items():
            totals[key] += value

    device = sandbox.device()
    assert device.peak <= limit, f"the hardware held {device.peak} bytes at once under a {limit}-byte limit"
    assert device.peak > limit - 6 * MIB, "the processes never came near the limit: the test proves nothing"
    assert totals["oom"] > 0, "no allocation was ever refused: the limit was never reached"
    assert totals["ok"] > 1000
    assert device.allocated == 0
    account = sandbox.account()
    assert account.device(0).memory_used == 0
    assert account.processes == ()
    assert account.device(0).memory_peak <= limit


def test_the_whole_limit_can_be_allocated_and_not_one_byte_more(sandbox):
    limit = 10 * MIB + 7
    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)))
    assert sandbox.device().peak == limit


ALL_APIS = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
ctx = use_device(cuda)
p, pitch, h, array, pool = c_ulonglong(), c_size_t(), c_ulonglong(), c_void_p(), c_void_p()
props = PoolProps(); props.alloc_type = 1; props.location = Location(1, 0)
assert cuda.cuMemPoolCreate(byref(pool), byref(props)) == 0
device_prop = AllocProp(); device_prop.type = 1; device_prop.location = Location(1, 0)
host_prop = AllocProp(); host_prop.type = 1; host_prop.location = Location(2, 0)
MIP = Array3DDesc(256, 128, 0, 0x01, 4, 0)
size = c_size_t

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected() if callable(expected) else expected, "accounted": after[0],
                    "real": after[1], "after_free": [accounted(), really_allocated()]}

free_p, free_async = lambda: cuda.cuMemFree_v2(p), lambda: cuda.cuMemFreeAsync(p, None)
measure("cuMemAlloc_v2", lambda: cuda.cuMemAlloc_v2(byref(p), size(1000003)), free_p, 1000003)
measure("cuMemAllocPitch_v2", lambda: cuda.cuMemAllocPitch_v2(byref(p), byref(pitch), size(1000), size(3000), 4),
        free_p, lambda: pitch.value * 3000)
measure("cuMemAllocManaged", lambda: cuda.cuMemAllocManaged(byref(p), size(777777), 1), free_p, 777777)
measure("cuMemAllocAsync", lambda: cuda.cuMemAllocAsync(byref(p), size(333333), None), free_async, 333333)
measure("cuMemAllocAsync_ptsz", lambda: cuda.cuMemAllocAsync_ptsz(byref(p), size(333334), None),
        lambda: cuda.cuMemFreeAsync_ptsz(p, None), 333334)
measure("cuMemAllocFromPoolAsync", lambda: cuda.cuMemAllocFromPoolAsync(byref(p), size(444444), pool, None),
        free_async, 444444)
measure("cuMemAllocFromPoolAsync_ptsz",
        lambda: cuda.cuMemAllocFromPoolAsync_ptsz(byref(p), size(444445), pool, None), free_p, 444445)
measure("cuMemCreate", lambda: cuda.cuMemCreate(byref(h), size(2 << 20), byref(device_prop), c_ulonglong(0)),
        lambda: cuda.cuMemRelease(h), 2 << 20)
measure("cuMemCreate(host)", lambda: cuda.cuMemCreate(byref(h), size(2 << 20), byref(host_prop), c_ulonglong(0)),
        lambda: cuda.cuMemRelease(h), 0)
measure("cuArrayCreate_v2", lambda: cuda.cuArrayCreate_v2(byref(array), byref(ArrayDesc(1000, 300, 0x20, 2))),
        lambda: cuda.cuArrayDestroy(array), 1000 * 300 * 4 * 2)
measure("cuArray3DCreate_v2",
        lambda: cuda.cuArray3DCreate_v2(byref(array), byref(Array3DDesc(100, 50, 7, 0x02, 4, 0))),
        lambda: cuda.cuArrayDestroy(array), 100 * 50 * 7 * 2 * 4)
measure("cuMipmappedArrayCreate", lambda: cuda.cuMipmappedArrayCreate(byref(array), byref(MIP), 5),
        lambda: cuda.cuMipmappedArrayDestroy(array), sum((256 >> l) * (128 >> l) * 4 for l in range(5)))
assert cuda.cuMemPoolDestroy(pool) == 0
"""


def test_every_allocating_api_is_counted_exactly_and_freed_exactly(sandbox):
    result = sandbox.python(ALL_APIS, sandbox.env(memory="1g"))
    assert len(result) == 12
    for api, seen in result.items():
        expected = seen["expected"]
        assert seen["accounted"] == expected, f"{api}: counted {seen['accounted']}, allocated {expected}"
        if api != "cuMemCreate(host)":
            assert seen["real"] == expected, f"{api}: the driver allocated {seen['real']}, expected {expected}"
        assert seen["after_free"] == [0, 0], f"{api}: after the free {seen['after_free']} remain"


OVER_THE_LIMIT = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
limit = int(os.environ["CUDA_DEVICE_MEMORY_LIMIT_0"])
p, pitch, h, array, pool = c_ulonglong(), c_size_t(), c_ulonglong(), c_void_p(), c_void_p()
props = PoolProps(); props.alloc_type = 1; props.location = Location(1, 0)
assert cuda.cuMemPoolCreate(byref(pool), byref(props)) == 0
prop = AllocProp(); prop.type = 1; prop.location = Location(1, 0)
over = c_size_t(limit + 1)
RESULT = {
    "cuMemAlloc_v2": cuda.cuMemAlloc_v2(byref(p), over),
    "cuMemAllocPitch_v2": cuda.cuMemAllocPitch_v2(byref(p), byref(pitch), c_size_t(limit), c_size_t(2), 4),
    "cuMemAllocManaged": cuda.cuMemAllocManaged(byref(p), over, 1),
    "cuMemAllocAsync": cuda.cuMemAllocAsync(byref(p), over, None),
    "cuMemAllocAsync_ptsz": cuda.cuMemAllocAsync_ptsz(byref(p), over, None),
    "cuMemAllocFromPoolAsync": cuda.cuMemAllocFromPoolAsync(byref(p), over, pool, None),
    "cuMemCreate": cuda.cuMemCreate(byref(h), over, byref(prop), c_ulonglong(0)),
    "cuArrayCreate_v2": cuda.cuArrayCreate_v2(byref(array), byref(ArrayDesc(limit // 4 + 1, 1, 0x20, 1))),
    "cuArray3DCreate_v2": cuda.cuArray3DCreate_v2(byref(array), byref(Array3DDesc(limit, 1, 2, 0x01, 1, 0))),
    "cuMipmappedArrayCreate": cuda.cuMipmappedArrayCreate(byref(array), byref(Array3DDesc(limit, 0, 0, 1, 1, 0)), 2),
}
RESULT["driver_asked"] = really_allocated()
"""


def test_over_the_limit_every_api_answers_out_of_memory_without_asking_the_driver(sandbox):
    result = sandbox.python(OVER_THE_LIMIT, sandbox.env(memory=str(4 * MIB)))
    assert result.pop("driver_asked") == 0
    assert result == dict.fromkeys(result, 2), "CUDA_ERROR_OUT_OF_MEMORY (2) expected from every API"
    assert sandbox.device().allocations == 0


QUERIES = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
p = c_ulonglong()
if "HOLD" in os.environ:
    assert cuda.cuMemAlloc_v2(byref(p), c_size_t(int(os.environ["HOLD"]))) == 0
free, total, device_total = c_size_t(), c_size_t(), c_size_t()
assert cuda.cuMemGetInfo_v2(byref(free), byref(total)) == 0
assert cuda.cuDeviceTotalMem_v2(byref(device_total), 0) == 0
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
handle = c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, byref(handle)) == 0
m1, m2 = Memory(), MemoryV2()
m2.version = ctypes.sizeof(MemoryV2) | (2 << 24)
assert nvml.nvmlDeviceGetMemoryInfo(handle, byref(m1)) == 0
assert nvml.nvmlDeviceGetMemoryInfo_v2(handle, byref(m2)) == 0
RESULT = {"cuda": [free.value, total.value], "device_total": device_total.value,
          "nvml": [m1.total, m1.free, m1.used], "nvml_v2": [m2.total, m2.free, m2.used]}
"""


def test_queries_report_the_limited_sizes(sandbox):
    held = 300 * MIB
    env = sandbox.env(memory="1g", extra={"HOLD": str(held), "FAKE_CUDA_MEMORY": "16g"})
    result = sandbox.python(QUERIES, env)
    gib = 1 << 30
    assert result["cuda"] == [gib - held, gib]
    assert result["device_total"] == gib
    assert result["nvml"] == [gib, gib - held, held]
    assert result["nvml_v2"] == [gib, gib - held, held]


def test_queries_are_never_larger_than_the_physical_device(sandbox):
    env = sandbox.env(memory="1g", extra={"HOLD": str(100 * MIB), "FAKE_CUDA_MEMORY": "512m"})
    result = sandbox.python(QUERIES, env)
    assert result["cuda"] == [412 * MIB, 512 * MIB]
    assert result["device_total"] == 512 * MIB
    assert result["nvml"] == [512 * MIB, 412 * MIB, 100 * MIB]


def test_queries_never_go_negative_when_the_container_holds_more_than_a_new_limit(sandbox):
    holder = sandbox.start("hold", 60 * MIB, 1, env=sandbox.env(memory="64m"))
    assert holder.stdout.readline().strip() == "held"
    result = sandbox.python(QUERIES, sandbox.env(memory="32m"))
    assert result["cuda"] == [0, 32 * MIB]
    assert result["nvml"] == [32 * MIB, 0, 60 * MIB]
    assert result["nvml_v2"] == [32 * MIB, 0, 60 * MIB]


def test_queries_without_a_limit_report_the_real_sizes(sandbox):
    env = sandbox.env(extra={"HOLD": str(5 * MIB), "FAKE_CUDA_MEMORY": "8g"})
    result = sandbox.python(QUERIES, env)
    eight = 8 << 30
    assert result["cuda"] == [eight - 5 * MIB, eight]
    assert result["device_total"] == eight
    assert result["nvml"] == [eight, eight - 5 * MIB, 5 * MIB]
    assert sandbox.account().device(0).memory_limit == 0


def test_oversubscription_reports_the_limit_above_the_physical_size(sandbox):
    env = sandbox.env(memory="2g", extra={"FAKE_CUDA_MEMORY": "1g", "CUDA_OVERSUBSCRIBE": "true"})
    result = sandbox.python(QUERIES, env)
    assert result["cuda"] == [2 << 30, 2 << 30]
    assert result["device_total"] == 2 << 30
    assert sandbox.account().oversubscribe


PER_DEVICE = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
p, q = c_ulonglong(), c_ulonglong()
free, total = c_size_t(), c_size_t()
for device in (1, 0):
    use_device(cuda, device)
    limit = int(os.environ[f"CUDA_DEVICE_MEMORY_LIMIT_{device}"][:-1]) << 20
    whole = cuda.cuMemAlloc_v2(byref(p), c_size_t(limit))
    more = cuda.cuMemAlloc_v2(byref(q), c_size_t(1))
    cuda.cuMemGetInfo_v2(byref(free), byref(total))
    RESULT[device] = [whole, more, free.value, total.value, accounted(device)]
"""


def test_each_visible_device_has_its_own_limit(sandbox):
    extra = {
        "FAKE_CUDA_DEVICES": "2",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "8m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "16m",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
    }
    result = sandbox.python(PER_DEVICE, sandbox.env(extra=extra))
    assert result["0"] == [0, 2, 0, 8 * MIB, 8 * MIB]
    assert result["1"] == [0, 2, 0, 16 * MIB, 16 * MIB]
    account = sandbox.account()
    assert [(d.index, d.uuid, d.memory_limit) for d in account.devices] == [
        (0, "GPU-aaaa", 8 * MIB),
        (1, "GPU-bbbb", 16 * MIB),
    ]


RESET = r"""
cuda = load_cuda()
assert cuda.cuInit(0) == 0
use_device(cuda)
p = c_ulonglong()
assert cuda.cuMemAlloc_v2(byref(p), c_size_t(6 << 20)) == 0
before = accounted()
assert cuda.cuDevicePrimaryCtxReset_v2(0) == 0
after = accounted()
use_device(cuda)
RESULT = {"before": before, "after": after, "whole_limit": cuda.cuMemAlloc_v2(byref(p), c_size_t(8 << 20))}
"""


def test_resetting_a_context_gives_its_memory_back(sandbox):
    result = sandbox.python(RESET, sandbox.env(memory="8m"))
    assert result == {"before": 6 * MIB, "after": 0, "whole_limit": 0}


@pytest.mark.parametrize("value", ["lots", "12q"])
def test_an_unreadable_limit_is_reported_and_ignored(sandbox, value):
    env = sandbox.env(extra={"CUDA_DEVICE_MEMORY_LIMIT": value, "LIBCUDA_LOG_LEVEL": "1"})
    result = sandbox.python("cuda = load_cuda(); cuda.cuInit(0); use_device(cuda)", env)
    assert result == {}
    assert sandbox.account().device(0).memory_limit == 0
