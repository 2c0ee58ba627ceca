"""Memory isolation over the fake DTK HIP runtime: limits hold to the byte across processes and threads, every
allocating API is counted exactly once (also when the runtime calls its own exported functions underneath), frees
give back exactly what was counted, and the queries tell the container's view."""

from __future__ import annotations

import json

MIB = 1 << 20
OOM = 2


def test_limit_holds_to_the_byte_under_16_processes_of_8_threads(sandbox):
    limit = 48 * MIB + 12345
    env = sandbox.env(memory=str(limit))
    procs = [sandbox.start("stress", 8, 2000, 6 * MIB, seed, env=env) for seed in range(16)]
    totals = {"ok": 0, "oom": 0}
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"a stress process failed:\n{out}\n{err}"
        for key, value in json.loads(out.strip().splitlines()[-1]).items():
            totals[key] += value
    device = sandbox.device()
    assert device.peak <= limit, f"the hardware held {device.peak} bytes at once under a {limit}-byte limit"
    assert device.peak > limit - 8 * MIB, "the processes never came near the limit: the test proves nothing"
    assert totals["oom"] > 0
    assert totals["ok"] > 1000
    assert device.allocated == 0
    account = sandbox.account()
    assert account.device(0).memory_used == 0
    assert account.processes == ()


def test_the_whole_limit_can_be_allocated_and_not_one_byte_more(sandbox):
    limit = 10 * MIB + 7
    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)))
    assert sandbox.device().peak == limit


ALL_APIS = r"""
hip = load_hip()
use_device(hip)
p, pitch, h = c_void_p(), c_size_t(), c_uint64()

class Loc(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class Prop(Structure):
    _fields_ = [("type", c_int), ("handle", c_int), ("location", Loc), ("win32", c_void_p), ("flags", c_uint32)]

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": (accounted(), really_allocated())}

size = c_size_t
measure("hipMalloc", lambda: hip.hipMalloc(byref(p), size(3 << 20)), lambda: hip.hipFree(p), 3 << 20)
measure("hipMallocManaged", lambda: hip.hipMallocManaged(byref(p), size(2 << 20), 1), lambda: hip.hipFree(p), 2 << 20)
measure("hipMallocAsync", lambda: hip.hipMallocAsync(byref(p), size(1 << 20), None),
        lambda: hip.hipFreeAsync(p, None), 1 << 20)
measure("hipMallocFromPoolAsync", lambda: hip.hipMallocFromPoolAsync(byref(p), size(1 << 20), None, None),
        lambda: hip.hipFreeAsync(p, None), 1 << 20)
measure("hipExtMallocWithFlags", lambda: hip.hipExtMallocWithFlags(byref(p), size(5 << 20), 1),
        lambda: hip.hipFree(p), 5 << 20)
measure("hipMallocPitch", lambda: hip.hipMallocPitch(byref(p), byref(pitch), size(1000), size(100)),
        lambda: hip.hipFree(p), 1024 * 100)
measure("hipMemCreate", lambda: hip.hipMemCreate(byref(h), size(4 << 20), byref(Prop(1, 0, Loc(1, 0))), c_uint64(0)),
        lambda: hip.hipMemRelease(h), 4 << 20)
"""


def test_every_api_is_counted_once_and_given_back(sandbox):
    result = sandbox.python(ALL_APIS, env=sandbox.env(memory="64m"))
    assert set(result) == {"hipMalloc", "hipMallocManaged", "hipMallocAsync", "hipMallocFromPoolAsync",
                           "hipExtMallocWithFlags", "hipMallocPitch", "hipMemCreate"}  # fmt: skip
    for name, r in result.items():
        assert r["accounted"] == r["expected"] == r["real"], (name, r)
        assert r["after_free"] == [0, 0], (name, r)


OVER = r"""
hip = load_hip()
use_device(hip)
p, pitch = c_void_p(), c_size_t()
RESULT["malloc"] = hip.hipMalloc(byref(p), c_size_t(9 << 20))
RESULT["managed"] = hip.hipMallocManaged(byref(p), c_size_t(9 << 20), 1)
RESULT["async"] = hip.hipMallocAsync(byref(p), c_size_t(9 << 20), None)
RESULT["ext"] = hip.hipExtMallocWithFlags(byref(p), c_size_t(9 << 20), 0)
# 8 MiB asked, but the runtime pads every row to 512 bytes: 8.5 MiB, over the limit
RESULT["pitch"] = hip.hipMallocPitch(byref(p), byref(pitch), c_size_t(8 * 1024 * 1024 // 2048 + 1), c_size_t(2048))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
"""


def test_over_the_limit_every_api_answers_out_of_memory_and_the_runtime_is_not_asked(sandbox):
    result = sandbox.python(OVER, env=sandbox.env(memory="8m"))
    assert result == {"malloc": OOM, "managed": OOM, "async": OOM, "ext": OOM, "pitch": OOM, "accounted": 0, "real": 0}


QUERIES = r"""
hip = load_hip()
use_device(hip)
p = c_void_p()
assert hip.hipMalloc(byref(p), c_size_t(3 << 20)) == 0
free, total, dev_total = c_size_t(), c_size_t(), c_size_t()
assert hip.hipMemGetInfo(byref(free), byref(total)) == 0
assert hip.hipDeviceTotalMem(byref(dev_total), 0) == 0
RESULT.update(free=free.value, total=total.value, device_total=dev_total.value)
"""


def test_memory_queries_show_the_limit(sandbox):
    result = sandbox.python(QUERIES, env=sandbox.env(memory="16m"))
    assert result == {"free": 13 * MIB, "total": 16 * MIB, "device_total": 16 * MIB}


def test_without_a_limit_the_queries_are_physical(sandbox):
    result = sandbox.python(QUERIES, env=sandbox.env())
    assert result["total"] == result["device_total"] == 64 << 30
    assert result["free"] == (64 << 30) - 3 * MIB


PROC_ADDRESS = r"""
hip = load_hip()
use_device(hip)
fn = c_void_p()
assert hip.hipGetProcAddress(b"hipMalloc", byref(fn), 600, c_uint64(0), None) == 0
malloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(c_void_p), c_size_t)(fn.value)
p = c_void_p()
RESULT["over"] = malloc(byref(p), c_size_t(9 << 20))
RESULT["within"] = malloc(byref(p), c_size_t(1 << 20))
RESULT["accounted"] = accounted()
"""


def test_hip_get_proc_address_hands_out_the_hooks(sandbox):
    assert sandbox.python(PROC_ADDRESS, env=sandbox.env(memory="8m")) == {"over": OOM, "within": 0, "accounted": MIB}
