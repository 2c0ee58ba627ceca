"""libvmusa.so over MUSA: the driver API (mu*, through the core's CUDA-compatible hook layer), the runtime API
(musa*, this library's own hooks, since the runtime reaches the driver through a private table) and the driver's
unversioned names share one limit and one accounting file; every way in (direct calls, dlsym, muGetProcAddress)
meets the hooks; launches through either API pass the compute limiter."""

from __future__ import annotations

import pytest

from hami.testing.isolation import SHARE_MEASUREMENT

MIB = 1 << 20
OOM = 2  # MUSA_ERROR_OUT_OF_MEMORY and musaErrorMemoryAllocation


def test_the_library_exports_the_layers_hooks_its_runtime_hooks_and_nothing_else(build):
    assert build.exported() == build.exports
    assert {"muMemAlloc_v2", "muGetProcAddress", "musaMalloc", "musaLaunchKernel", "muMemAlloc"} <= build.exports


RUNTIME = r"""
musa = load_musa()
assert musa.musaSetDevice(0) == 0
p, q, pitch = c_void_p(), c_void_p(), c_size_t()

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": (accounted(), really_allocated())}

size = c_size_t
measure("musaMalloc", lambda: musa.musaMalloc(byref(p), size(3 << 20)), lambda: musa.musaFree(p), 3 << 20)
# the fake runtime's musaMallocManaged is its musaMalloc underneath, called through the global scope
measure("musaMallocManaged", lambda: musa.musaMallocManaged(byref(p), size(2 << 20), 1), lambda: musa.musaFree(p),
        2 << 20)
measure("musaMallocAsync", lambda: musa.musaMallocAsync(byref(p), size(1 << 20), None),
        lambda: musa.musaFreeAsync(p, None), 1 << 20)
measure("musaMallocFromPoolAsync", lambda: musa.musaMallocFromPoolAsync(byref(p), size(1 << 20), None, None),
        lambda: musa.musaFreeAsync(p, None), 1 << 20)
measure("musaMallocPitch", lambda: musa.musaMallocPitch(byref(p), byref(pitch), size(1000), size(100)),
        lambda: musa.musaFree(p), 1024 * 100)
"""


def test_every_runtime_api_is_counted_once_and_given_back(sandbox):
    result = sandbox.python(RUNTIME, env=sandbox.env(memory="64m"))
    assert set(result) == {"musaMalloc", "musaMallocManaged", "musaMallocAsync", "musaMallocFromPoolAsync",
                           "musaMallocPitch"}  # fmt: skip
    for name, r in result.items():
        assert r["accounted"] == r["expected"] == r["real"], (name, r)
        assert r["after_free"] == [0, 0], (name, r)


SHARED = r"""
cuda = load_cuda()
assert cuda.muInit(0) == 0
use_device(cuda)
musa = load_musa()
assert musa.musaSetDevice(0) == 0
program = ctypes.CDLL(None)  # a program linked against the unversioned names binds them in the global scope
d, r, a, over = c_ulonglong(), c_void_p(), c_ulonglong(), c_void_p()
RESULT["driver"] = cuda.muMemAlloc_v2(byref(d), c_size_t(3 << 20))
RESULT["runtime"] = musa.musaMalloc(byref(r), c_size_t(3 << 20))
RESULT["alias"] = program.muMemAlloc(byref(a), c_size_t(1 << 20))
RESULT["runtime_over"] = musa.musaMalloc(byref(over), c_size_t(2 << 20))
RESULT["driver_over"] = cuda.muMemAlloc_v2(byref(over), c_size_t(2 << 20))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
free, total = c_size_t(), c_size_t()
assert musa.musaMemGetInfo(byref(free), byref(total)) == 0
RESULT["runtime_view"] = [free.value, total.value]
assert program.muMemGetInfo(byref(free), byref(total)) == 0
RESULT["alias_view"] = [free.value, total.value]
assert program.muMemFree(a) == 0 and cuda.muMemFree_v2(d) == 0 and musa.musaFree(r) == 0
RESULT["after_free"] = [accounted(), really_allocated()]
"""


def test_driver_runtime_and_unversioned_names_share_one_limit(sandbox):
    result = sandbox.python(SHARED, env=sandbox.env(memory="8m"))
    assert (result["driver"], result["runtime"], result["alias"]) == (0, 0, 0)
    assert (result["runtime_over"], result["driver_over"]) == (OOM, OOM)  # 7 MiB held, 2 more would pass 8
    assert result["accounted"] == result["real"] == 7 * MIB  # the refused calls never reached MUSA
    assert result["runtime_view"] == result["alias_view"] == [1 * MIB, 8 * MIB]
    assert result["after_free"] == [0, 0]


def test_without_a_limit_the_runtime_answers_for_itself(sandbox):
    code = RUNTIME + "\nfree, total = c_size_t(), c_size_t()\n"
    code += "assert musa.musaMemGetInfo(byref(free), byref(total)) == 0\nRESULT['view'] = [free.value, total.value]\n"
    result = sandbox.python(code, env=sandbox.env(extra={"FAKE_CUDA_MEMORY": "1g"}))
    assert result["view"] == [1 << 30, 1 << 30]


LOOKUPS = r"""
cuda = load_cuda()
musa = load_musa()
runtime = ctypes.CDLL("libmusart.so")
for name in ("musaMalloc", "musaFree", "musaMemGetInfo", "musaLaunchKernel", "musaLaunchKernelExC"):
    RESULT[name] = where(libc.dlsym(runtime._handle, name.encode()))
for name in ("muMemAlloc_v2", "muLaunchKernel", "muMemAlloc"):
    RESULT[name] = where(libc.dlsym(cuda._handle, name.encode()))
RESULT["global muMemAlloc"] = where(libc.dlsym(None, b"muMemAlloc"))
assert cuda.muInit(0) == 0
fn = c_void_p()
assert cuda.muGetProcAddress(b"muMemAlloc", byref(fn), 12000, c_uint64(0)) == 0
RESULT["proc muMemAlloc"] = where(fn.value)
"""


def test_dlsym_and_mu_get_proc_address_answer_the_hooks(sandbox):
    result = sandbox.python(LOOKUPS, sandbox.env(memory=str(64 * MIB)))
    runtime = ("musaMalloc", "musaFree", "musaMemGetInfo", "musaLaunchKernel", "musaLaunchKernelExC")
    for name in (*runtime, "muMemAlloc_v2", "muLaunchKernel"):
        assert result[name] == ["libvmusa.so", name], name
    # the fake driver, like CUDA's, exports only muMemAlloc_v2: its handle has no unversioned name to answer, while
    # a program bound to the name in the global scope meets the alias, and muGetProcAddress maps it to the _v2 hook
    assert result["muMemAlloc"] == [None, None]
    assert result["global muMemAlloc"] == ["libvmusa.so", "muMemAlloc"]
    assert result["proc muMemAlloc"] == ["libvmusa.so", "muMemAlloc_v2"]


OVER = r"""
musa = load_musa()
assert musa.musaSetDevice(0) == 0
p, pitch = c_void_p(), c_size_t()
RESULT["malloc"] = musa.musaMalloc(byref(p), c_size_t(9 << 20))
RESULT["managed"] = musa.musaMallocManaged(byref(p), c_size_t(9 << 20), 1)
RESULT["async"] = musa.musaMallocAsync(byref(p), c_size_t(9 << 20), None)
# 8 MiB asked, but rows are padded to 512 bytes: 8.5 MiB, over the limit
RESULT["pitch"] = musa.musaMallocPitch(byref(p), byref(pitch), c_size_t(8 * 1024 * 1024 // 2048 + 1), c_size_t(2048))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
"""


def test_over_the_limit_the_runtime_answers_out_of_memory_and_is_not_asked(sandbox):
    result = sandbox.python(OVER, env=sandbox.env(memory="8m"))
    assert result == {"malloc": OOM, "managed": OOM, "async": OOM, "pitch": OOM, "accounted": 0, "real": 0}


LAUNCHES = r"""
musa = load_musa()
assert musa.musaSetDevice(0) == 0
grid, block = Dim3(4, 1, 1), Dim3(64, 1, 1)
for i in range(200):
    assert musa.musaLaunchKernel(c_void_p(0x1000), grid, block, None, c_size_t(0), None) == 0
    assert musa.musaLaunchCooperativeKernel(c_void_p(0x2000), grid, block, None, c_size_t(0), None) == 0
    assert musa.musaGraphLaunch(c_void_p(0x3000), None) == 0
assert musa.musaDeviceSynchronize() == 0
"""


def test_runtime_launches_pass_the_compute_limiter(sandbox):
    sandbox.python(LAUNCHES, env=sandbox.env(cores=30, extra={"FAKE_CUDA_KERNEL_NS": "20000"}))
    device = sandbox.account().device(0)
    assert device.core_limit == 30
    # 600 runtime launches, each admitted by the limiter once (the cooperative one reaches musaLaunchKernel inside the
    # runtime, which is not counted again); the limiter adds to the shared count in batches of 64 per thread
    assert 600 - 64 < device.launches <= 600


RUNTIME_STRESS = r"""
import random, threading
musa = load_musa()
counts = {"ok": 0, "oom": 0, "other": 0}
lock = threading.Lock()

def worker(seed):
    assert musa.musaSetDevice(0) == 0
    rng, held = random.Random(seed), []
    for _ in range(1500):
        if held and rng.random() < 0.45:
            assert musa.musaFree(held.pop(rng.randrange(len(held)))) == 0
            continue
        p = c_void_p()
        kind = rng.randrange(3)
        size = c_size_t(rng.randrange(1, 6 << 20))
        r = (musa.musaMalloc(byref(p), size) if kind == 0 else musa.musaMallocManaged(byref(p), size, 1) if kind == 1
             else musa.musaMallocAsync(byref(p), size, None))
        with lock:
            counts["ok" if r == 0 else "oom" if r == MUSA_OOM else "other"] += 1
        if r == 0:
            held.append(p)
    for p in held:
        assert musa.musaFree(p) == 0

threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
RESULT.update(counts)
"""


def test_the_runtime_limit_holds_to_the_byte_under_8_threads(sandbox):
    limit = 24 * MIB + 4321
    result = sandbox.python(RUNTIME_STRESS, env=sandbox.env(memory=str(limit)), timeout=120)
    device = sandbox.device()
    assert result["other"] == 0
    assert device.peak <= limit, f"MUSA held {device.peak} bytes at once under a {limit}-byte limit"
    assert device.peak > limit - 6 * MIB, "the threads never came near the limit: the test proves nothing"
    assert result["oom"] > 0
    assert result["ok"] > 1000
    assert device.allocated == 0
    assert sandbox.account().device(0).memory_used == 0


RUNTIME_SHARE = r"""
import time
musa = load_musa()
assert musa.musaSetDevice(0) == 0
grid, block = Dim3(132, 1, 1), Dim3(64, 1, 1)

def busy():  # device time of tag 0 so far (fake_device.h: busy_ns[0] at 32 in device 0's record)
    with open(os.environ[FAKE_STATE_VARIABLE], "rb") as handle:
        return struct.unpack_from("<Q", handle.read(), 256 + 32)[0]

start = time.monotonic()
marks = {}
while time.monotonic() - start < 2.4:
    assert musa.musaLaunchKernel(c_void_p(0x1000), grid, block, None, c_size_t(0), None) == 0
    elapsed = time.monotonic() - start
    if "first" not in marks and elapsed > 0.8:
        marks["first"] = (busy(), time.monotonic())
    if "second" not in marks and elapsed > 2.2:
        marks["second"] = (busy(), time.monotonic())
assert musa.musaDeviceSynchronize() == 0
(b0, t0), (b1, t1) = marks["first"], marks["second"]
RESULT["share"] = (b1 - b0) / ((t1 - t0) * 1e9)
"""


@SHARE_MEASUREMENT
def test_runtime_launches_settle_near_a_30_percent_limit(sandbox):
    env = sandbox.env(cores=30, extra={"FAKE_CUDA_KERNEL_NS": "1000000"})
    share = sandbox.python(RUNTIME_SHARE, env=env)["share"]
    assert share == pytest.approx(0.30, abs=0.05), f"the device was {share:.1%} busy under a 30% limit"
    assert sandbox.account().device(0).core_limit == 30


def test_accounting_names_the_vendor_and_the_gpus(sandbox):
    uuid = "0c8e1a2b-0000-4000-8000-000000000000"
    env = sandbox.env(memory="64m", cores=25, extra={"MUSA_DEVICE_UUIDS": uuid})
    holder = sandbox.start("hold", 12 * MIB, 3, env=env)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    account = sandbox.account()
    assert account.vendor == "mthreads"
    device = account.device(0)
    assert (device.uuid, device.memory_limit, device.core_limit, device.memory_used) == (uuid, 64 * MIB, 25, 12 * MIB)
    (process,) = account.processes
    assert process.pid == holder.pid
