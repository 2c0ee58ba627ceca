"""Memory isolation over the fake CNDrv and CNRT: the limit holds to the byte across processes and threads, every
allocating API of both is counted exactly once (also when CNRT reaches CNDrv underneath, through the PLT or
cnGetExportFunction, and when CNDrv calls its own functions), frees give back exactly what was counted, and the
queries tell the container's view."""

from __future__ import annotations

from hami.testing.isolation import finish

MIB = 1 << 20
OOM = 100100  # CN_MEMORY_ERROR_OUT_OF_MEMORY and cnrtErrorNoMem


def test_the_library_exports_its_hooks_and_nothing_else(build):
    assert build.exported() == build.exports


def test_limit_holds_to_the_byte_under_8_processes_of_4_threads(sandbox):
    limit = 32 * MIB + 12345
    env = sandbox.env(memory=str(limit))
    procs = [sandbox.start("stress", 4, 1500, 6 * MIB, seed, env=env) for seed in range(8)]
    totals = {"ok": 0, "oom": 0}
    for proc in procs:
        for key, value in finish(proc).items():
            totals[key] += value
    device = sandbox.device()
    assert device.peak <= limit, f"the hardware held {device.peak} bytes at once under a {limit}-byte limit"
    assert device.peak > limit - 6 * MIB, "the processes never came near the limit: the test proves nothing"
    assert totals["oom"] > 0
    assert totals["ok"] > 500
    assert device.allocated == 0
    assert sandbox.account().device(0).memory_used == 0


def test_the_whole_limit_can_be_allocated_and_not_one_byte_more(sandbox):
    limit = 10 * MIB + 7
    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)))
    assert sandbox.device().peak == limit


ALL_APIS = r"""
rt = load_cnrt()
use_device(rt)
a, p, h = c_uint64(), c_void_p(), c_uint64()

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": (accounted(), really_allocated())}

u64, size = c_uint64, c_size_t
cn_free = lambda: rt.cnFree(a)
measure("cnrtMalloc", lambda: rt.cnrtMalloc(byref(p), size(3 << 20)), lambda: rt.cnrtFree(p), 3 << 20)
measure("cnMalloc", lambda: rt.cnMalloc(byref(a), u64(2 << 20)), cn_free, 2 << 20)
measure("cnMallocSecurity", lambda: rt.cnMallocSecurity(byref(a), u64(1 << 20)), cn_free, 1 << 20)
measure("cnMallocNode", lambda: rt.cnMallocNode(byref(a), u64(1 << 20), 0), cn_free, 1 << 20)
measure("cnZmalloc", lambda: rt.cnZmalloc(byref(a), u64(4 << 20)), cn_free, 4 << 20)
measure("cnZmallocNode", lambda: rt.cnZmallocNode(byref(a), u64(1 << 20), 0), cn_free, 1 << 20)
measure("cnMallocConstant", lambda: rt.cnMallocConstant(byref(a), u64(1 << 20)), cn_free, 1 << 20)
measure("cnMallocNodeConstant", lambda: rt.cnMallocNodeConstant(byref(a), u64(1 << 20), 0), cn_free, 1 << 20)
measure("cnMallocFrameBuffer", lambda: rt.cnMallocFrameBuffer(byref(a), u64(1 << 20), 0), cn_free, 1 << 20)
measure("cnMallocPeerAble", lambda: rt.cnMallocPeerAble(byref(a), u64(1 << 20)), cn_free, 1 << 20)
measure("cnMemAllocAsync", lambda: rt.cnMemAllocAsync(byref(a), size(5 << 20), None),
        lambda: rt.cnMemFreeAsync(a, None), 5 << 20)
measure("cnMemAllocFromPoolAsync", lambda: rt.cnMemAllocFromPoolAsync(byref(a), size(1 << 20), None, None),
        lambda: rt.cnMemFreeAsync(a, None), 1 << 20)
measure("cnMemCreate", lambda: rt.cnMemCreate(byref(h), u64(2 << 20), None, u64(0)),
        lambda: rt.cnMemRelease(h), 2 << 20)
"""


def test_every_api_is_counted_once_and_given_back(sandbox):
    result = sandbox.python(ALL_APIS, env=sandbox.env(memory="64m"))
    assert len(result) == 13
    for name, r in result.items():
        assert r["accounted"] == r["expected"] == r["real"], (name, r)
        assert r["after_free"] == [0, 0], (name, r)


OVER = r"""
rt = load_cnrt()
use_device(rt)
a, p, h = c_uint64(), c_void_p(), c_uint64()
RESULT["cnrtMalloc"] = rt.cnrtMalloc(byref(p), c_size_t(9 << 20))
RESULT["cnMalloc"] = rt.cnMalloc(byref(a), c_uint64(9 << 20))
RESULT["cnZmalloc"] = rt.cnZmalloc(byref(a), c_uint64(9 << 20))
RESULT["cnMemAllocAsync"] = rt.cnMemAllocAsync(byref(a), c_size_t(9 << 20), None)
RESULT["cnMemCreate"] = rt.cnMemCreate(byref(h), c_uint64(9 << 20), None, c_uint64(0))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
"""


def test_over_the_limit_every_api_answers_out_of_memory_and_the_driver_is_not_asked(sandbox):
    result = sandbox.python(OVER, env=sandbox.env(memory="8m"))
    assert result == {"cnrtMalloc": OOM, "cnMalloc": OOM, "cnZmalloc": OOM, "cnMemAllocAsync": OOM,
                      "cnMemCreate": OOM, "accounted": 0, "real": 0}  # fmt: skip


QUERIES = r"""
rt = load_cnrt()
use_device(rt)
p = c_void_p()
assert rt.cnrtMalloc(byref(p), c_size_t(3 << 20)) == 0
free, total = c_size_t(), c_size_t()
assert rt.cnrtMemGetInfo(byref(free), byref(total)) == 0
cn_free, cn_total = c_uint64(), c_uint64()
assert rt.cnMemGetInfo(byref(cn_free), byref(cn_total)) == 0
RESULT.update(cnrt=[free.value, total.value], cn=[cn_free.value, cn_total.value])
"""


def test_memory_queries_show_the_limit(sandbox):
    result = sandbox.python(QUERIES, env=sandbox.env(memory="16m"))
    assert result == {"cnrt": [13 * MIB, 16 * MIB], "cn": [13 * MIB, 16 * MIB]}


def test_without_a_limit_the_queries_are_physical(sandbox):
    result = sandbox.python(QUERIES, env=sandbox.env())
    assert result == {"cnrt": [(16 << 30) - 3 * MIB, 16 << 30], "cn": [(16 << 30) - 3 * MIB, 16 << 30]}


TOTALS = r"""
rt = load_cnrt()
use_device(rt)
p = c_void_p()
assert rt.cnrtMalloc(byref(p), c_size_t(3 << 20)) == 0
free, total, device_total = c_uint64(), c_uint64(), c_uint64()
assert rt.cnMemGetNodeInfo(byref(free), byref(total), 0) == 0
assert rt.cnDeviceTotalMem(byref(device_total), c_uint64(0)) == 0
mb, width = ctypes.c_int(), ctypes.c_int()
assert rt.cnrtDeviceGetAttribute(byref(mb), 0x405, 0) == 0  # cnrtAttrTotalMemSize
assert rt.cnrtDeviceGetAttribute(byref(width), 0x404, 0) == 0  # cnrtAttrGmemBusWidth
RESULT.update(node=[free.value, total.value], device_total=device_total.value, total_mb=mb.value,
              bus_width=width.value, bad_node=rt.cnMemGetNodeInfo(byref(free), byref(total), 1))
"""


def test_node_info_device_total_and_the_total_memory_attribute_show_the_limit(sandbox):
    """Every other way a program reads a device's memory: CNDrv's per-node query and device total, and CNRT's
    cnrtAttrTotalMemSize (MB; torch_mlu's total_memory), the last reaching cnDeviceTotalMem underneath (cut once).
    Other attributes and the driver's refusals are passed through."""
    limited = sandbox.python(TOTALS, env=sandbox.env(memory="16m"))
    assert limited == {"node": [13 * MIB, 16 * MIB], "device_total": 16 * MIB, "total_mb": 16, "bus_width": 4096,
                       "bad_node": 100006}  # fmt: skip
    physical = sandbox.python(TOTALS, env=sandbox.env())
    assert physical == {"node": [(16 << 30) - 3 * MIB, 16 << 30], "device_total": 16 << 30, "total_mb": 16 << 10,
                        "bus_width": 4096, "bad_node": 100006}  # fmt: skip


EXPORT_FUNCTION = r"""
rt = load_cnrt()
use_device(rt)
fn = c_void_p()
assert rt.cnGetExportFunction(b"cnMalloc", byref(fn)) == 0
malloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(c_uint64), c_uint64)(fn.value)
a = c_uint64()
RESULT["over"] = malloc(byref(a), c_uint64(9 << 20))
RESULT["within"] = malloc(byref(a), c_uint64(1 << 20))
RESULT["accounted"] = accounted()
"""


def test_cn_get_export_function_hands_out_the_hooks(sandbox):
    result = sandbox.python(EXPORT_FUNCTION, env=sandbox.env(memory="8m"))
    assert result == {"over": OOM, "within": 0, "accounted": MIB}  # the answer was the hook: counted, limited
