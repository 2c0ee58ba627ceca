"""Memory isolation: limits hold to the byte across processes and threads, every allocating API of both layers is
counted exactly once, frees give back exactly what was counted, and the queries tell the container's view."""

from __future__ import annotations

import json

import pytest

MIB = 1 << 20
OOM = 207001


def test_limit_holds_to_the_byte_under_16_processes_of_8_threads(sandbox):
    """16 processes x 8 threads allocate through every API of the runtime and of AscendCL and free at random under
    one odd-sized limit: what the (fake) hardware really held never exceeds the limit, and everything is given back
    when they exit."""
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
acl, rt = load_acl(), load_runtime()
use_device(acl)
p, h = c_void_p(), c_void_p()
size = c_size_t
device_side, host_side = DrvMemProp(1, 0), DrvMemProp(0, 0)
acl_device, acl_host = AclPhysicalProp(location=AclLocation(0, 1)), AclPhysicalProp(location=AclLocation(0, 0))
pad = lambda n: (n + 31) // 32 * 32 + 32

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": [accounted(), really_allocated()]}

measure("rtMalloc", lambda: rt.rtMalloc(byref(p), c_uint64(1000003), 2, 0), lambda: rt.rtFree(p), 1000003)
measure("rtMalloc(host)", lambda: rt.rtMalloc(byref(p), c_uint64(1 << 20), 0x81, 0), lambda: rt.rtFree(p), 0)
measure("rtMallocPhysical", lambda: rt.rtMallocPhysical(byref(h), size(2 << 20), byref(device_side), c_uint64(0)),
        lambda: rt.rtFreePhysical(h), 2 << 20)
measure("rtMallocPhysical(host)", lambda: rt.rtMallocPhysical(byref(h), size(2 << 20), byref(host_side),
        c_uint64(0)), lambda: rt.rtFreePhysical(h), 0)
measure("aclrtMalloc", lambda: acl.aclrtMalloc(byref(p), size(777777), 0), lambda: acl.aclrtFree(p), pad(777777))
measure("aclrtMallocAlign32", lambda: acl.aclrtMallocAlign32(byref(p), size(333333), 0), lambda: acl.aclrtFree(p),
        (333333 + 31) // 32 * 32)
measure("aclrtMallocCached", lambda: acl.aclrtMallocCached(byref(p), size(444444), 0), lambda: acl.aclrtFree(p),
        pad(444444))
measure("aclrtMallocHost", lambda: acl.aclrtMallocHost(byref(p), size(1 << 20)), lambda: acl.aclrtFreeHost(p), 0)
measure("aclrtMallocPhysical", lambda: acl.aclrtMallocPhysical(byref(h), size(4 << 20), byref(acl_device),
        c_uint64(0)), lambda: acl.aclrtFreePhysical(h), 4 << 20)
measure("aclrtMallocPhysical(host)", lambda: acl.aclrtMallocPhysical(byref(h), size(4 << 20), byref(acl_host),
        c_uint64(0)), lambda: acl.aclrtFreePhysical(h), 0)
measure("rtMalloc freed by aclrtFree", lambda: rt.rtMalloc(byref(p), c_uint64(5555), 2, 0), lambda: acl.aclrtFree(p),
        5555)
measure("aclrtMalloc freed by rtFree", lambda: acl.aclrtMalloc(byref(p), size(6666), 0), lambda: rt.rtFree(p),
        pad(6666))
"""


@pytest.mark.parametrize("private", [False, True], ids=["acl-reaches-runtime", "acl-reaches-unhooked-runtime"])
def test_every_allocating_api_is_counted_exactly_once_and_freed_exactly(sandbox, private):
    """Each API of both layers is counted at the size the device really holds; AscendCL's allocations count once
    whether they reach a hooked runtime function (the runtime hook takes the reservation over) or not (the
    AscendCL hook counts them)."""
    extra = {"FAKE_ACL_PRIVATE_MALLOC": "1"} if private else {}
    result = sandbox.python(ALL_APIS, sandbox.env(memory="1g", extra=extra))
    assert len(result) == 12
    for api, seen in result.items():
        expected = seen["expected"]
        assert seen["accounted"] == expected, f"{api}: counted {seen['accounted']}, allocated {expected}"
        if "host" not in api:
            assert seen["real"] == expected, f"{api}: the runtime allocated {seen['real']}, expected {expected}"
        assert seen["after_free"] == [0, 0], f"{api}: after the free {seen['after_free']} remain"
    assert sandbox.device().host_allocations == 4


OVER_THE_LIMIT = r"""
acl, rt = load_acl(), load_runtime()
use_device(acl)
limit = int(os.environ["ASCEND_DEVICE_MEMORY_LIMIT_0"])
p, h = c_void_p(), c_void_p()
over = c_size_t(limit + 1)
RESULT = {
    "rtMalloc": rt.rtMalloc(byref(p), c_uint64(limit + 1), 2, 0),
    "rtMallocPhysical": rt.rtMallocPhysical(byref(h), over, byref(DrvMemProp(1, 0)), c_uint64(0)),
    "aclrtMalloc": acl.aclrtMalloc(byref(p), c_size_t(limit - 16), 0),  # padded past the limit
    "aclrtMallocAlign32": acl.aclrtMallocAlign32(byref(p), over, 0),
    "aclrtMallocCached": acl.aclrtMallocCached(byref(p), over, 0),
    "aclrtMallocPhysical": acl.aclrtMallocPhysical(byref(h), over, byref(AclPhysicalProp(location=AclLocation(0, 1))),
                                                   c_uint64(0)),
}
RESULT["runtime_asked"] = really_allocated()
"""


def test_over_the_limit_every_api_answers_207001_without_asking_the_runtime(sandbox):
    result = sandbox.python(OVER_THE_LIMIT, sandbox.env(memory=str(4 * MIB)))
    assert result.pop("runtime_asked") == 0
    assert result == dict.fromkeys(result, OOM), "ACL_ERROR_RT_MEMORY_ALLOCATION (207001) expected from every API"
    assert sandbox.device().allocations == 0


TORCH_STYLE = r"""
# As PyTorch's Ascend backend does: its own handle of libascendcl.so, functions looked up on it with dlsym, so the
# exported AscendCL hooks are bypassed and only the runtime layer underneath sees the allocation.
libc = ctypes.CDLL(None)
libc.dlopen.restype = c_void_p
libc.dlopen.argtypes = [c_char_p, c_int]
libc.dlsym.restype = c_void_p
libc.dlsym.argtypes = [c_void_p, c_char_p]
RTLD_NOW, RTLD_LOCAL = 2, 0
handle = libc.dlopen(b"libascendcl.so", RTLD_NOW | RTLD_LOCAL)
fn = lambda name, *types: ctypes.CFUNCTYPE(c_int, *types)(libc.dlsym(handle, name.encode()))
malloc = fn("aclrtMallocAlign32", POINTER(c_void_p), c_size_t, c_int)
free = fn("aclrtFree", c_void_p)
set_device = fn("aclrtSetDevice", c_int)
get_info = fn("aclrtGetMemInfo", c_int, POINTER(c_size_t), POINTER(c_size_t))
assert set_device(0) == 0
limit = int(os.environ["ASCEND_DEVICE_MEMORY_LIMIT_0"])
p, q = c_void_p(), c_void_p()
RESULT["whole"] = malloc(byref(p), limit, 0)
RESULT["counted"] = accounted()
RESULT["one_more"] = malloc(byref(q), 32, 0)
f, t = c_size_t(), c_size_t()
RESULT["info"] = [get_info(1, byref(f), byref(t)), f.value, t.value]
RESULT["free"] = free(p)
RESULT["after"] = accounted()
"""


def test_a_private_handle_of_ascendcl_is_limited_through_the_runtime_layer(sandbox):
    limit = 8 * MIB
    result = sandbox.python(TORCH_STYLE, sandbox.env(memory=str(limit), extra={"FAKE_NPU_MEMORY": "64g"}))
    assert result == {
        "whole": 0,
        "counted": limit,
        "one_more": OOM,
        "info": [0, 0, limit],
        "free": 0,
        "after": 0,
    }


QUERIES = r"""
acl, rt = load_acl(), load_runtime()
use_device(acl)
p = c_void_p()
if "HOLD" in os.environ:
    assert rt.rtMalloc(byref(p), c_uint64(int(os.environ["HOLD"])), 2, 0) == 0
answers = {}
for name, call in [("rtMemGetInfoEx", lambda f, t: rt.rtMemGetInfoEx(1, f, t)),
                   ("rtMemGetInfoEx(ddr)", lambda f, t: rt.rtMemGetInfoEx(0, f, t)),
                   ("rtMemGetInfo", lambda f, t: rt.rtMemGetInfo(f, t)),
                   ("aclrtGetMemInfo", lambda f, t: acl.aclrtGetMemInfo(1, f, t)),
                   ("aclrtGetMemInfo(huge)", lambda f, t: acl.aclrtGetMemInfo(4, f, t))]:
    free, total = c_size_t(), c_size_t()
    assert call(byref(free), byref(total)) == 0, name
    answers[name] = [free.value, total.value]
RESULT = {"views": sorted(set(tuple(v) for v in answers.values())), "names": len(answers)}
"""


@pytest.mark.parametrize(
    ("limit", "physical", "held", "view"),
    [
        ("1g", "16g", 300 * MIB, [(1 << 30) - 300 * MIB, 1 << 30]),  # the limit
        ("1g", "512m", 100 * MIB, [412 * MIB, 512 * MIB]),  # never more than the device
        (None, "8g", 5 * MIB, [(8 << 30) - 5 * MIB, 8 << 30]),  # no limit: the device's own numbers
    ],
    ids=["limited", "physical-smaller", "unlimited"],
)
def test_every_query_of_both_layers_reports_the_same_view(sandbox, limit, physical, held, view):
    env = sandbox.env(memory=limit, extra={"HOLD": str(held), "FAKE_NPU_MEMORY": physical})
    result = sandbox.python(QUERIES, env)
    assert result == {"views": [view], "names": 5}


def test_queries_never_go_negative_when_the_container_holds_more_than_a_new_limit(sandbox):
    holder = sandbox.start("hold", 60 * MIB, 1, env=sandbox.env(memory="64m"))
    assert holder.stdout.readline().strip() == "held"
    result = sandbox.python(QUERIES, sandbox.env(memory="32m"))
    assert result == {"views": [[0, 32 * MIB]], "names": 5}


def test_oversubscription_reports_the_limit_above_the_physical_size(sandbox):
    env = sandbox.env(memory="2g", extra={"FAKE_NPU_MEMORY": "1g", "ASCEND_OVERSUBSCRIBE": "true"})
    result = sandbox.python(QUERIES, env)
    assert result == {"views": [[2 << 30, 2 << 30]], "names": 5}
    assert sandbox.account().oversubscribe


PER_DEVICE = r"""
acl, rt = load_acl(), load_runtime()
p, q = c_void_p(), c_void_p()
free, total = c_size_t(), c_size_t()
for device in (1, 0):
    use_device(acl, device)
    limit = int(os.environ[f"ASCEND_DEVICE_MEMORY_LIMIT_{device}"][:-1]) << 20
    whole = acl.aclrtMallocAlign32(byref(p), c_size_t(limit), 0)
    more = rt.rtMalloc(byref(q), c_uint64(1), 2, 0)
    acl.aclrtGetMemInfo(1, byref(free), byref(total))
    RESULT[device] = [whole, more, free.value, total.value, accounted(device)]
"""


def test_each_visible_device_has_its_own_limit_and_uuid(sandbox):
    extra = {
        "FAKE_NPU_DEVICES": "2",
        "ASCEND_DEVICE_MEMORY_LIMIT_0": "8m",
        "ASCEND_DEVICE_MEMORY_LIMIT_1": "16m",
        "ASCEND_DEVICE_UUIDS": "AAAAAAAA-00000001-00000002-00000003-00000004,BBBBBBBB-00000001-00000002-00000003-0",
    }
    result = sandbox.python(PER_DEVICE, sandbox.env(extra=extra))
    assert result["0"] == [0, OOM, 0, 8 * MIB, 8 * MIB]
    assert result["1"] == [0, OOM, 0, 16 * MIB, 16 * MIB]
    account = sandbox.account()
    assert account.vendor == "ascend"
    assert [(d.index, d.uuid, d.memory_limit) for d in account.devices] == [
        (0, "AAAAAAAA-00000001-00000002-00000003-00000004", 8 * MIB),
        (1, "BBBBBBBB-00000001-00000002-00000003-0", 16 * MIB),
    ]


@pytest.mark.parametrize("value", ["lots", "12q"])
def test_an_unreadable_limit_is_reported_and_ignored(sandbox, value):
    env = sandbox.env(extra={"ASCEND_DEVICE_MEMORY_LIMIT": value, "LIBVNPU_LOG_LEVEL": "1"})
    result = sandbox.python("acl = load_acl(); use_device(acl)", env)
    assert result == {}
    assert sandbox.account().device(0).memory_limit == 0
