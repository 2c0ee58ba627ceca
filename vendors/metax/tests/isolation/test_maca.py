"""libvmaca.so over the fake MACA runtime: built from the core's rt layer with MACA's names and exporting exactly its
hooks, every allocating call counted once (also when the runtime calls its own exports underneath), the limit to the
byte under many processes, out of memory answered without asking the runtime, the container's view in mcMemGetInfo,
the compute share of every kind of launch, and the accounting file the node daemon reads."""

from __future__ import annotations

import importlib.util
import json
from functools import partial
from pathlib import Path

import pytest

from hami.isolation import accounting, source_dir
from hami.testing.isolation import SHARE_MEASUREMENT, device_shares, finish

MIB = 1 << 20
OOM = 2
HOOK = Path(__file__).resolve().parents[2] / "hatch_build.py"


def load_hook():
    spec = importlib.util.spec_from_file_location("hami_metax_hatch_build", HOOK)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_compiler_is_a_clear_build_error(tmp_path):
    hook = load_hook()
    with pytest.raises(hook.build.IsolationLibraryError, match=r"no C compiler found.*hami-vendor-metax"):
        hook.build.find_compiler(hook.SPEC, {"PATH": str(tmp_path)})


def test_the_library_exports_only_its_hooks(tmp_path, build, exports_of):
    hook = load_hook()
    library = hook.build.compile_library(hook.SPEC, tmp_path / "libvmaca.so", source_dir())
    assert exports_of(library) == build.exports
    assert {"mcMalloc", "mcFree", "mcMemGetInfo", "mcLaunchKernel", "mcModuleLaunchKernel"} <= build.exports


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
    assert sandbox.account().device(0).memory_used == 0


ALL_APIS = r"""
mc = load_maca()
use_device(mc)
p, pitch = c_void_p(), c_size_t()

def measure(name, allocate, free, expected):
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": (accounted(), really_allocated())}

size = c_size_t
measure("mcMalloc", lambda: mc.mcMalloc(byref(p), size(3 << 20)), lambda: mc.mcFree(p), 3 << 20)
measure("mcMallocManaged", lambda: mc.mcMallocManaged(byref(p), size(2 << 20), 1), lambda: mc.mcFree(p), 2 << 20)
measure("mcMallocAsync", lambda: mc.mcMallocAsync(byref(p), size(1 << 20), None), lambda: mc.mcFreeAsync(p, None),
        1 << 20)
measure("mcExtMallocWithFlags", lambda: mc.mcExtMallocWithFlags(byref(p), size(5 << 20), 1), lambda: mc.mcFree(p),
        5 << 20)
measure("mcMallocPitch", lambda: mc.mcMallocPitch(byref(p), byref(pitch), size(1000), size(100)),
        lambda: mc.mcFree(p), 1024 * 100)
"""


def test_every_api_is_counted_once_and_given_back(sandbox):
    result = sandbox.python(ALL_APIS, env=sandbox.env(memory="64m"))
    assert set(result) == {"mcMalloc", "mcMallocManaged", "mcMallocAsync", "mcExtMallocWithFlags", "mcMallocPitch"}
    for name, r in result.items():
        assert r["accounted"] == r["expected"] == r["real"], (name, r)
        assert r["after_free"] == [0, 0], (name, r)


OVER = r"""
mc = load_maca()
use_device(mc)
p, pitch = c_void_p(), c_size_t()
RESULT["malloc"] = mc.mcMalloc(byref(p), c_size_t(9 << 20))
RESULT["managed"] = mc.mcMallocManaged(byref(p), c_size_t(9 << 20), 1)
RESULT["async"] = mc.mcMallocAsync(byref(p), c_size_t(9 << 20), None)
RESULT["ext"] = mc.mcExtMallocWithFlags(byref(p), c_size_t(9 << 20), 0)
RESULT["pitch"] = mc.mcMallocPitch(byref(p), byref(pitch), c_size_t(8 * 1024 * 1024 // 2048 + 1), c_size_t(2048))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
"""


def test_over_the_limit_every_api_answers_out_of_memory_and_the_runtime_is_not_asked(sandbox):
    result = sandbox.python(OVER, env=sandbox.env(memory="8m"))
    assert result == {"malloc": OOM, "managed": OOM, "async": OOM, "ext": OOM, "pitch": OOM, "accounted": 0, "real": 0}


QUERIES = r"""
mc = load_maca()
use_device(mc)
p = c_void_p()
assert mc.mcMalloc(byref(p), c_size_t(3 << 20)) == 0
free, total = c_size_t(), c_size_t()
assert mc.mcMemGetInfo(byref(free), byref(total)) == 0
RESULT.update(free=free.value, total=total.value)
"""


def test_mem_get_info_shows_the_limit(sandbox):
    assert sandbox.python(QUERIES, env=sandbox.env(memory="16m")) == {"free": 13 * MIB, "total": 16 * MIB}
    physical = sandbox.python(QUERIES, env=sandbox.env())
    assert physical == {"free": (64 << 30) - 3 * MIB, "total": 64 << 30}


shares = partial(device_shares, warmup=0.6, window=1.2)

WORKLOADS = {
    "1ms kernels": ("kernel", [32], {"FAKE_MX_KERNEL_NS": "1000000"}),
    "every kind of launch, 2.6us to 1.3ms": ("mixed", [132, 8448, 65536, 1024], {"FAKE_MX_KERNEL_NS_PER_BLOCK": "20"}),
    "module launches reaching mcLaunchKernel underneath": ("module", [48], {"FAKE_MX_KERNEL_NS": "800000"}),
}


@SHARE_MEASUREMENT
@pytest.mark.parametrize("workload", WORKLOADS)
def test_utilization_settles_near_a_30_percent_limit(sandbox, workload):
    mode, blocks, timing = WORKLOADS[workload]
    proc = sandbox.start("launch", 2.2, mode, *blocks, env=sandbox.env(cores=30, extra=timing))
    (share,) = shares(sandbox, [0])
    finish(proc)
    assert share == pytest.approx(0.30, abs=0.05), f"{workload}: the device was {share:.1%} busy under a 30% limit"
    assert sandbox.account().device(0).core_limit == 30


def test_without_a_limit_launches_run_unthrottled(sandbox):
    out = sandbox.client_json("launch", 0.3, "mixed", 1, env=sandbox.env(extra={"FAKE_MX_KERNEL_NS": "0"}))
    assert out["launches"] > 1000


UUID = "GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba"


def test_reader_sees_the_devices_and_processes_the_library_wrote(sandbox):
    env = sandbox.env(memory="64m", cores=40, extra={"MACA_DEVICE_UUIDS": UUID, "FAKE_MX_KERNEL_NS": "200000"})
    holder = sandbox.start("hold", 12 * MIB, 3, env=env)
    assert holder.stdout.readline().strip() == "held"
    sandbox.client("launch", 0.3, "kernel", 64, env=env)
    account = sandbox.account()
    assert account.version == accounting.VERSION
    assert account.vendor == "metax"
    device = account.device(0)
    assert (device.uuid, device.memory_limit, device.core_limit) == (UUID, 64 * MIB, 40)
    assert device.memory_used == 12 * MIB
    assert device.launches > 0
    (process,) = account.processes
    assert process.pid == holder.pid
    assert process.memory_used == 12 * MIB
