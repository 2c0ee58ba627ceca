"""The test kit of libraries on the CUDA-runtime-shaped hook layer (``hami/isolation/rt``): a fake runtime, the
client, and the sandbox setup, for any vendor whose runtime is CUDA's runtime under another prefix (HIP, MACA).

`rt_isolation_setup` reads what the vendor's ``isolation/hami_rt_vendor.h`` says (the prefix, the optional families
its runtime has, the environment variables' names) and builds the `hami.testing.sandbox.IsolationSetup` the shared
checks (`hami.testing.isolation`) run with: ``csrc/fake_rt.c`` built as the vendor's runtime library over the fake
device (without -Bsymbolic, so that its calls to its own exported functions go through the global scope as a real
runtime's may), ``csrc/rt_client.c`` linked against it, and the export list the layer gives that vendor. The header
is the one source of truth: the library, the fake and the client are compiled from it, and so is this list.

`RtLayerTests` are the checks every such library passes, written once for the layer (a vendor's test module
subclasses them, naming its build hook): the export list, memory to the byte and counted once per API (also when the
runtime calls its own exports underneath), out of memory without asking the runtime, the container's view in the
queries, the compute share of every kind of launch, and the accounting file the node daemon reads. The ctypes scripts
reach the vendor's API through the layer's prelude (`rt(lib, "Malloc")` is ``lib.<prefix>Malloc``).
`LaunchConfigTests` are the checks of a library whose runtime has the launch-config launch (``HAMI_RT_HAS_LAUNCH_EXC``:
``<prefix>LaunchKernelExC``, CUDA's cudaLaunchKernelExC): a tenant launching through it is throttled as through
LaunchKernel.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from hami.isolation import accounting, source_dir
from hami.testing.isolation import LINKER_DOORS, SHARE_MEASUREMENT, device_shares, finish
from hami.testing.sandbox import (
    CSRC,
    FAKE_DEVICE,
    ISOLATION_CLIENT,
    Build,
    CTarget,
    IsolationSetup,
    Sandbox,
    exported_functions,
    fake_library,
)

__all__ = [
    "FAKE_RT",
    "RT_CLIENT",
    "LaunchConfigTests",
    "RtLayerTests",
    "rt_hooks",
    "rt_isolation_setup",
    "vendor_header",
]

FAKE_RT = CSRC / "fake_rt.c"
RT_CLIENT = CSRC / "rt_client.c"

COMMON_HOOKS = (
    "Malloc", "Free", "MallocManaged", "MallocAsync", "FreeAsync", "MallocPitch", "ExtMallocWithFlags", "MemGetInfo",
    "SetDevice", "LaunchKernel", "LaunchCooperativeKernel", "ModuleLaunchKernel", "GraphLaunch",
)  # fmt: skip
OPTIONAL_HOOKS = {
    "POOL": ("MallocFromPoolAsync",),
    "VMM": ("MemCreate", "MemRelease"),
    "DEVICE_TOTAL_MEM": ("DeviceTotalMem",),
    "EXT_LAUNCH": ("ExtLaunchKernel", "ExtModuleLaunchKernel"),
    "HCC": ("HccModuleLaunchKernel",),
    "MODULE_COOPERATIVE": ("ModuleLaunchCooperativeKernel",),
    "LAUNCH_EXC": ("LaunchKernelExC",),
    "PROC_ADDRESS": ("GetProcAddress",),
}
_DEFINE = re.compile(r"^#define\s+(HAMI_RT_\w+)\s+(.+?)\s*(?:/\*.*)?$", re.MULTILINE)


def vendor_header(isolation: Path) -> dict[str, str]:
    """The ``#define HAMI_RT_*`` values of ``<isolation>/hami_rt_vendor.h`` (strings unquoted)."""
    text = (isolation / "hami_rt_vendor.h").read_text()
    return {name: value.strip('"') if value.startswith('"') else value for name, value in _DEFINE.findall(text)}


def rt_hooks(defines: Mapping[str, str]) -> tuple[str, ...]:
    """Every function a library on the layer hooks for a vendor whose header says `defines`."""
    prefix = defines["HAMI_RT_PREFIX"]
    names = list(COMMON_HOOKS)
    for family, hooks in OPTIONAL_HOOKS.items():
        if defines.get(f"HAMI_RT_HAS_{family}", "0").strip() == "1":
            names.extend(hooks)
    return tuple(prefix + n for n in names)


PRELUDE = r"""
def load_runtime():
    # the runtime as a program linked against it sees it: names are looked up in the global scope, where the
    # preloaded isolation library comes first
    ctypes.CDLL(RT_RUNTIME, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

def rt(lib, name):
    return getattr(lib, RT_PREFIX + name)
"""


def rt_isolation_setup(
    *, package: str, library: str, project: Path, runtime: str, fake_prefix: str, prelude: str = ""
) -> IsolationSetup:
    """The sandbox setup of `library` (in `package`, built from `project`) over the fake runtime built as `runtime`
    (its variables prefixed `fake_prefix`); `prelude`, the vendor's own additions to the layer's ctypes prelude."""
    isolation = project / "isolation"
    defines = vendor_header(isolation)
    fake = fake_library(runtime, FAKE_RT, FAKE_DEVICE, symbolic=False)
    flags = (*fake.flags, f"-I{isolation}", f'-DFAKE_RT_ENV="{fake_prefix}"')
    hooks = rt_hooks(defines)
    return IsolationSetup(
        package=package,
        library=library,
        project=project,
        fakes=(CTarget(fake.output, fake.sources, flags, fake.link),),
        client=CTarget(
            "client",
            (RT_CLIENT, ISOLATION_CLIENT),
            flags=(f"-I{isolation}",),
            link=("-L{build}", f"-l:{runtime}", "-Wl,-rpath-link,{build}"),
        ),
        exports=frozenset(hooks) | LINKER_DOORS,
        hooks={defines["HAMI_RT_PREFIX"]: hooks},
        fake_prefix=fake_prefix,
        memory_limit_variable=defines["HAMI_RT_ENV_MEMORY_LIMIT"],
        core_limit_variable=defines["HAMI_RT_ENV_CORE_LIMIT"],
        accounting_variable=defines["HAMI_RT_ENV_SHARED_CACHE"],
        log_level_variable=defines["HAMI_RT_ENV_LOG_LEVEL"],
        prelude=f"RT_PREFIX = {defines['HAMI_RT_PREFIX']!r}\nRT_RUNTIME = {runtime!r}\n"
        f"RT_HOOKS = {list(hooks)!r}\n{PRELUDE}\n{prelude}",
    )


MIB = 1 << 20
OOM = 2

ALL_APIS = r"""
lib = load_runtime()
assert rt(lib, "SetDevice")(0) == 0
p, pitch, h = c_void_p(), c_size_t(), c_uint64()

class Loc(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class Prop(Structure):
    _fields_ = [("type", c_int), ("handle", c_int), ("location", Loc), ("win32", c_void_p), ("flags", c_uint32)]

def measure(name, allocate, free, expected):
    if RT_PREFIX + name not in RT_HOOKS:
        return
    r = allocate()
    assert r == 0, f"{name} returned {r}"
    after = (accounted(), really_allocated())
    assert free() == 0, f"freeing {name} failed"
    RESULT[name] = {"expected": expected, "accounted": after[0], "real": after[1],
                    "after_free": (accounted(), really_allocated())}

f = lambda name: rt(lib, name)
size = c_size_t
measure("Malloc", lambda: f("Malloc")(byref(p), size(3 << 20)), lambda: f("Free")(p), 3 << 20)
measure("MallocManaged", lambda: f("MallocManaged")(byref(p), size(2 << 20), 1), lambda: f("Free")(p), 2 << 20)
measure("MallocAsync", lambda: f("MallocAsync")(byref(p), size(1 << 20), None), lambda: f("FreeAsync")(p, None),
        1 << 20)
measure("MallocFromPoolAsync", lambda: f("MallocFromPoolAsync")(byref(p), size(1 << 20), None, None),
        lambda: f("FreeAsync")(p, None), 1 << 20)
measure("ExtMallocWithFlags", lambda: f("ExtMallocWithFlags")(byref(p), size(5 << 20), 1), lambda: f("Free")(p),
        5 << 20)
measure("MallocPitch", lambda: f("MallocPitch")(byref(p), byref(pitch), size(1000), size(100)), lambda: f("Free")(p),
        1024 * 100)
measure("MemCreate", lambda: f("MemCreate")(byref(h), size(4 << 20), byref(Prop(1, 0, Loc(1, 0))), c_uint64(0)),
        lambda: f("MemRelease")(h), 4 << 20)
"""

OVER = r"""
lib = load_runtime()
assert rt(lib, "SetDevice")(0) == 0
p, pitch = c_void_p(), c_size_t()
RESULT["malloc"] = rt(lib, "Malloc")(byref(p), c_size_t(9 << 20))
RESULT["managed"] = rt(lib, "MallocManaged")(byref(p), c_size_t(9 << 20), 1)
RESULT["async"] = rt(lib, "MallocAsync")(byref(p), c_size_t(9 << 20), None)
RESULT["ext"] = rt(lib, "ExtMallocWithFlags")(byref(p), c_size_t(9 << 20), 0)
# 8 MiB asked, but the runtime pads every row to 512 bytes: 8.5 MiB, over the limit
RESULT["pitch"] = rt(lib, "MallocPitch")(byref(p), byref(pitch), c_size_t(8 * 1024 * 1024 // 2048 + 1), c_size_t(2048))
RESULT["accounted"], RESULT["real"] = accounted(), really_allocated()
"""

QUERIES = r"""
lib = load_runtime()
assert rt(lib, "SetDevice")(0) == 0
p = c_void_p()
assert rt(lib, "Malloc")(byref(p), c_size_t(3 << 20)) == 0
free, total, dev_total = c_size_t(), c_size_t(), c_size_t()
assert rt(lib, "MemGetInfo")(byref(free), byref(total)) == 0
RESULT.update(free=free.value, total=total.value)
if RT_PREFIX + "DeviceTotalMem" in RT_HOOKS:
    assert rt(lib, "DeviceTotalMem")(byref(dev_total), 0) == 0
    RESULT["device_total"] = dev_total.value
"""

_shares = partial(device_shares, warmup=0.6, window=1.2)


def _load_hook(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_rt_hatch_build_{path.parent.name}", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RtLayerTests:
    """The checks of a library on the rt layer (see the module); a vendor's test module subclasses this class with
    its build hook (`hatch_build`), its fake device's variable prefix and a device UUID for the accounting check."""

    hatch_build: ClassVar[Path]  # the vendor's hatch_build.py
    fake_prefix: ClassVar[str]  # FAKE_DCU_
    uuid: ClassVar[str]  # a UUID as the node names the vendor's devices

    def test_no_compiler_is_a_clear_build_error(self, tmp_path: Path) -> None:
        hook = _load_hook(self.hatch_build)
        with pytest.raises(hook.build.IsolationLibraryError, match=rf"no C compiler found.*{hook.SPEC.distribution}"):
            hook.build.find_compiler(hook.SPEC, {"PATH": str(tmp_path)})

    def test_the_library_exports_only_its_hooks(self, tmp_path: Path, build: Build) -> None:
        hook = _load_hook(self.hatch_build)
        library = hook.build.compile_library(hook.SPEC, tmp_path / hook.SPEC.library, source_dir())
        assert exported_functions(library) == build.exports

    def test_limit_holds_to_the_byte_under_16_processes_of_8_threads(self, sandbox: Sandbox) -> None:
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

    def test_the_whole_limit_can_be_allocated_and_not_one_byte_more(self, sandbox: Sandbox) -> None:
        limit = 10 * MIB + 7
        sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)))
        assert sandbox.device().peak == limit

    def test_every_api_is_counted_once_and_given_back(self, sandbox: Sandbox) -> None:
        result = sandbox.python(ALL_APIS, env=sandbox.env(memory="64m"))
        prefix = vendor_header(sandbox.setup.project / "isolation")["HAMI_RT_PREFIX"]
        measured = {"Malloc", "MallocManaged", "MallocAsync", "MallocFromPoolAsync", "ExtMallocWithFlags",
                    "MallocPitch", "MemCreate"}  # fmt: skip
        assert set(result) == {n for n in measured if prefix + n in sandbox.setup.exports}
        for name, r in result.items():
            assert isinstance(r, dict)
            assert r["accounted"] == r["expected"] == r["real"], (name, r)
            assert r["after_free"] == [0, 0], (name, r)

    def test_over_the_limit_every_api_answers_out_of_memory_and_the_runtime_is_not_asked(
        self, sandbox: Sandbox
    ) -> None:
        result = sandbox.python(OVER, env=sandbox.env(memory="8m"))
        assert result == {"malloc": OOM, "managed": OOM, "async": OOM, "ext": OOM, "pitch": OOM, "accounted": 0,
                          "real": 0}  # fmt: skip

    def test_memory_queries_show_the_limit(self, sandbox: Sandbox) -> None:
        result = sandbox.python(QUERIES, env=sandbox.env(memory="16m"))
        assert (result["free"], result["total"]) == (13 * MIB, 16 * MIB)
        assert result.get("device_total", 16 * MIB) == 16 * MIB

    def test_without_a_limit_the_queries_are_physical(self, sandbox: Sandbox) -> None:
        result = sandbox.python(QUERIES, env=sandbox.env())
        assert result["total"] == result.get("device_total", result["total"]) == 64 << 30
        assert result["free"] == (64 << 30) - 3 * MIB

    WORKLOADS: ClassVar[dict[str, tuple[str, list[int], dict[str, str]]]] = {
        "1ms kernels": ("kernel", [32], {"KERNEL_NS": "1000000"}),
        "every kind of launch, 2.6us to 1.3ms": ("mixed", [132, 8448, 65536, 1024], {"KERNEL_NS_PER_BLOCK": "20"}),
        "module launches reaching LaunchKernel underneath": ("module", [48], {"KERNEL_NS": "800000"}),
    }

    @SHARE_MEASUREMENT
    @pytest.mark.parametrize("workload", list(WORKLOADS))
    def test_utilization_settles_near_a_30_percent_limit(self, sandbox: Sandbox, workload: str) -> None:
        mode, blocks, timing = self.WORKLOADS[workload]
        extra = {self.fake_prefix + k: v for k, v in timing.items()}
        proc = sandbox.start("launch", "2.2", mode, *blocks, env=sandbox.env(cores=30, extra=extra))
        (share,) = _shares(sandbox, [0])
        finish(proc)
        assert share == pytest.approx(0.30, abs=0.05), f"{workload}: the device was {share:.1%} busy under a 30% limit"
        device = sandbox.account().device(0)
        assert device.core_limit == 30
        assert device.launches > 0

    @SHARE_MEASUREMENT
    def test_two_containers_share_in_proportion_to_their_limits(self, sandbox: Sandbox) -> None:
        timing = {self.fake_prefix + "KERNEL_NS": "500000"}
        a = sandbox.start("launch", "2.2", "kernel", 16,
                          env=sandbox.env("a", cores=20, extra={**timing, self.fake_prefix + "TAG": "0"}))  # fmt: skip
        b = sandbox.start("launch", "2.2", "kernel", 16,
                          env=sandbox.env("b", cores=50, extra={**timing, self.fake_prefix + "TAG": "1"}))  # fmt: skip
        first, second = _shares(sandbox, [0, 1])
        finish(a)
        finish(b)
        assert first == pytest.approx(0.20, abs=0.05)
        assert second == pytest.approx(0.50, abs=0.06)

    def test_without_a_limit_launches_run_unthrottled(self, sandbox: Sandbox) -> None:
        env = sandbox.env(extra={self.fake_prefix + "KERNEL_NS": "0"})
        assert sandbox.client_json("launch", "0.3", "mixed", 1, env=env)["launches"] > 1000

    def test_reader_sees_the_devices_and_processes_the_library_wrote(self, sandbox: Sandbox) -> None:
        defines = vendor_header(sandbox.setup.project / "isolation")
        extra = {defines["HAMI_RT_ENV_UUIDS"]: self.uuid, self.fake_prefix + "KERNEL_NS": "200000"}
        env = sandbox.env(memory="64m", cores=40, extra=extra)
        holder = sandbox.start("hold", 12 * MIB, 3, env=env)
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        sandbox.client("launch", "0.3", "kernel", 64, env=env)
        account = sandbox.account()
        assert account.version == accounting.VERSION
        assert account.vendor == defines["HAMI_RT_VENDOR_NAME"]
        device = account.device(0)
        assert (device.uuid, device.memory_limit, device.core_limit) == (self.uuid, 64 * MIB, 40)
        assert device.memory_used == 12 * MIB
        assert device.launches > 0
        (process,) = account.processes
        assert process.pid == holder.pid
        assert process.memory_used == 12 * MIB


NULL_CONFIG = r"""
lib = load_runtime()
assert rt(lib, "SetDevice")(0) == 0
RESULT["answer"] = rt(lib, "LaunchKernelExC")(None, c_void_p(0x1000), None)
"""


class LaunchConfigTests:
    """What a tenant tries with the launch-config launch, ``<prefix>LaunchKernelExC`` (CUDA's cudaLaunchKernelExC:
    the grid and the stream in a struct), for a library whose runtime has it (its header's
    ``HAMI_RT_HAS_LAUNCH_EXC``): calling it directly instead of LaunchKernel to get around a core limit. A vendor's
    test module subclasses this class with its fake device's variable prefix."""

    fake_prefix: ClassVar[str]  # FAKE_MX_

    def test_the_installed_library_hooks_launch_kernel_exc(self, build: Build) -> None:
        (prefix,) = build.hooks
        assert prefix + "LaunchKernelExC" in build.exported(), (
            f"{build.library} does not export {prefix}LaunchKernelExC: a tenant's launches through it bypass the "
            "compute limiter (list it in the version script)"
        )

    @SHARE_MEASUREMENT
    def test_a_tenant_launching_through_launch_kernel_exc_is_throttled_as_through_launch_kernel(
        self, sandbox: Sandbox
    ) -> None:
        """The workload of `RtLayerTests`' "1ms kernels" (its plain-launch check), launched through LaunchKernelExC."""
        mode, blocks, timing = RtLayerTests.WORKLOADS["1ms kernels"]
        assert mode == "kernel"
        extra = {self.fake_prefix + k: v for k, v in timing.items()}
        proc = sandbox.start("launch", "2.2", "exc", *blocks, env=sandbox.env(cores=30, extra=extra))
        (share,) = _shares(sandbox, [0])
        finish(proc)
        entry = "LaunchKernelExC"
        assert share == pytest.approx(0.30, abs=0.05), f"{entry}: the device was {share:.1%} busy under a 30% limit"
        device = sandbox.account().device(0)
        assert device.core_limit == 30
        assert device.launches > 0, f"the limiter never saw a launch through {entry}"

    def test_a_null_config_reaches_the_runtime(self, sandbox: Sandbox) -> None:
        """The hook reads nothing through a NULL config: the runtime answers (the fake: invalid configuration, 9, a
        code the library never gives itself), under a core limit too, and the process lives on."""
        result = sandbox.python(NULL_CONFIG, env=sandbox.env(cores=30))
        if sandbox.build.real_driver:
            assert result["answer"] != 0
        else:
            assert result["answer"] == 9
