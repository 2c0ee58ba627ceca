"""Fixtures of the isolation tests: the installed libvgpu.so in front of fake drivers built here.

`build` (once per session) finds ``libvgpu.so`` inside the installed ``hami_vendor_nvidia`` package (an editable
install has it in the source tree, a wheel in site-packages) and compiles, with the system C compiler, the fake
CUDA driver (``libcuda.so.1``), the minimal fake NVML (``libnvidia-ml.so.1``), the client program that the tests
and the benchmark drive, and two tiny libraries for the RTLD_NEXT check. `sandbox` (per test) gives a directory
with the fakes' shared state file and one accounting file per "container", environments that preload the
library as ``/etc/ld.so.preload`` would, and readers for what the library and the fake hardware recorded.

To run the same tests against a real GPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real
``libcuda.so.1``/``libnvidia-ml.so.1`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hami.isolation import accounting
from hami.isolation import sources as core_sources

HERE = Path(__file__).resolve().parent
HOOKS = HERE.parents[1] / "isolation"  # vendors/nvidia/isolation (present in a checkout and in copies of it)
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
FAKE_STATE_SIZE = 4096

# Every function libvgpu.so hooks: the contract of its export list and of its three ways in.
CUDA_HOOKS = [
    "cuInit",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
    "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxDestroy_v2",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxReset_v2",
]
NVML_HOOKS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2")
EXPORTS = frozenset({"dlsym", *CUDA_HOOKS, *NVML_HOOKS})

_INTERPOSED = "int hami_probe(void) { return 1; }\n"
_INTERPOSER = """#define _GNU_SOURCE
#include <dlfcn.h>
int hami_probe(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "hami_probe");
    return next ? 100 + next() : -1;
}
"""


def installed_library() -> Path:
    """libvgpu.so of the installed hami-vendor-nvidia (fails the test run with what to do when missing)."""
    try:
        path = Path(str(importlib.resources.files("hami_vendor_nvidia") / "lib" / "libvgpu.so"))
    except ModuleNotFoundError:
        pytest.fail("hami-vendor-nvidia is not installed: `uv pip install -e ./vendors/nvidia` (or its wheel)")
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist: the package was installed without its isolation library. Reinstall it "
            "(`uv pip install -e ./vendors/nvidia` compiles it; a C compiler is needed)"
        )
    if "/src/hami_vendor_nvidia/" in path.as_posix():  # an editable install: it may be older than the C sources
        newest = max((*HOOKS.glob("*.[ch]"), *core_sources(), *HOOKS.glob("*.map")), key=lambda p: p.stat().st_mtime)
        if newest.stat().st_mtime > path.stat().st_mtime:
            pytest.fail(
                f"{path} is older than {newest}: rebuild it with `python vendors/nvidia/hatch_build.py` "
                "or `uv pip install -e ./vendors/nvidia`"
            )
    return path


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not found:
        pytest.skip("the isolation tests build fake drivers and need a C compiler (cc, gcc or clang)")
    return found


def exported_functions(library: Path) -> set[str]:
    """Names of the functions and objects a shared library exports (its defined global .dynsym entries)."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{library} is not a 64-bit ELF file")
    endian = "<" if data[5] == 1 else ">"
    (shoff,) = struct.unpack_from(endian + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
    sections = [struct.unpack_from(endian + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, info, _, shndx, _, _ = struct.unpack_from(endian + "IBBHQQ", data, at)
            if shndx != 0 and info >> 4 in (1, 2) and name:  # defined, GLOBAL or WEAK
                end = data.index(b"\0", strtab + name)
                names.add(data[strtab + name : end].decode())
    return names


@dataclass(frozen=True)
class Build:
    """The library under test and what the tests built around it."""

    directory: Path  # libcuda.so.1 and libnvidia-ml.so.1 (the fakes) live here
    libvgpu: Path
    client: Path
    interposer: Path
    interposed: Path
    real_driver: bool  # HAMI_ISOLATION_DRIVER_DIR points at a real driver: fake-only checks skip
    cuda_hooks: tuple[str, ...] = tuple(CUDA_HOOKS)
    nvml_hooks: tuple[str, ...] = NVML_HOOKS
    exports: frozenset[str] = EXPORTS

    def exported(self) -> set[str]:
        """What libvgpu.so really exports."""
        return exported_functions(self.libvgpu)


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    libvgpu = installed_library()
    cc = compiler()
    out = tmp_path_factory.mktemp("isolation-build")

    def compile_(*args: str | Path) -> None:
        proc = subprocess.run([cc, *CFLAGS, *map(str, args)], capture_output=True, text=True, check=False)
        if proc.returncode:
            pytest.fail(f"compiling {args[-1]} failed:\n{proc.stderr}")

    shared = ["-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic"]
    compile_(*shared, "-Wl,-soname,libcuda.so.1", HERE / "fake_cuda.c", "-o", out / "libcuda.so.1")
    compile_(*shared, "-Wl,-soname,libnvidia-ml.so.1", HERE / "fake_nvml.c", "-o", out / "libnvidia-ml.so.1")
    compile_(HERE / "client.c", f"-L{out}", "-l:libcuda.so.1", "-o", out / "client")
    (out / "interposed.c").write_text(_INTERPOSED)
    (out / "interposer.c").write_text(_INTERPOSER)
    compile_("-fPIC", "-shared", out / "interposed.c", "-o", out / "libinterposed.so")
    compile_("-fPIC", "-shared", out / "interposer.c", "-o", out / "libinterposer.so", "-ldl")
    driver_dir = os.environ.get("HAMI_ISOLATION_DRIVER_DIR")
    return Build(
        directory=Path(driver_dir) if driver_dir else out,
        libvgpu=libvgpu,
        client=out / "client",
        interposer=out / "libinterposer.so",
        interposed=out / "libinterposed.so",
        real_driver=bool(driver_dir),
    )


@dataclass(frozen=True)
class FakeDevice:
    """One device of the fake hardware, as its shared state says."""

    allocated: int
    peak: int
    launches: int
    busy_ns: tuple[int, ...]
    allocations: int


_PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT")


@dataclass
class Sandbox:
    """One test's world: fake hardware, containers (accounting files), processes started in them."""

    build: Build
    root: Path
    _processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def fake_state(self) -> Path:
        return self.root / "fake.state"

    def cache(self, container: str = "a") -> Path:
        return self.root / f"{container}.cache"

    def env(
        self,
        container: str = "a",
        *,
        memory: str | None = None,
        sm: int | None = None,
        extra: Mapping[str, str] | None = None,
        preload: bool = True,
    ) -> dict[str, str]:
        """The environment of a process of `container`, with HAMi's variables as Allocate would set them."""
        env = {k: v for k, v in os.environ.items() if k in _PASSED_THROUGH}
        env.update(
            LD_LIBRARY_PATH=str(self.build.directory),
            FAKE_CUDA_STATE=str(self.fake_state),
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.cache(container)),
            LIBCUDA_LOG_LEVEL="0",
        )
        if preload:
            env["LD_PRELOAD"] = str(self.build.libvgpu)
        if memory is not None:
            env["CUDA_DEVICE_MEMORY_LIMIT_0"] = memory
        if sm is not None:
            env["CUDA_DEVICE_SM_LIMIT"] = str(sm)
        env.update(extra or {})
        return env

    def client(self, *args: str | int, env: Mapping[str, str], timeout: float = 60) -> str:
        """Run the client to completion; its stdout. Fails the test with its output when it fails."""
        argv = [str(self.build.client), *map(str, args)]
        try:
            proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(argv)} did not finish within {timeout} s")
        if proc.returncode:
            pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def client_json(self, *args: str | int, env: Mapping[str, str], timeout: float = 60) -> dict[str, float]:
        result: dict[str, float] = json.loads(self.client(*args, env=env, timeout=timeout).strip().splitlines()[-1])
        return result

    def start(self, *args: str | int, env: Mapping[str, str]) -> subprocess.Popen[str]:
        """Start the client in the background (killed at the end of the test)."""
        proc = subprocess.Popen(
            [str(self.build.client), *map(str, args)],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._processes.append(proc)
        return proc

    def python(self, code: str, env: Mapping[str, str], timeout: float = 60) -> dict[str, object]:
        """Run `code` after PRELUDE in a Python process with `env`; the dict it left in RESULT."""
        script = PRELUDE + "\n" + code + "\nprint('RESULT ' + json.dumps(RESULT))\n"
        proc = subprocess.run(
            [sys.executable, "-c", script], env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            pytest.fail(f"the ctypes script failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        result: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
        return result

    def account(self, container: str = "a") -> accounting.ContainerAccount:
        return accounting.read_accounting(self.cache(container))

    def running(self, container: str = "a") -> tuple[accounting.ProcessAccount, ...]:
        """The processes the container's accounting file lists; none while it does not exist or is being made."""
        try:
            return self.account(container).processes
        except (FileNotFoundError, accounting.AccountingFileError):
            return ()

    def device(self, index: int = 0) -> FakeDevice:
        if self.build.real_driver:
            pytest.skip("only the fake driver can tell what is really allocated")
        data = self.fake_state.read_bytes()
        base = 256 + 256 * index
        allocated, peak, _, launches = struct.unpack_from("<4Q", data, base)
        busy = struct.unpack_from("<8Q", data, base + 32)
        (allocations,) = struct.unpack_from("<Q", data, base + 96)
        return FakeDevice(allocated, peak, launches, busy, allocations)

    def lock_word(self, container: str = "a") -> int:
        """The first 4 bytes of the accounting file's mutex: the owner's thread id, with FUTEX_* bits."""
        with open(self.cache(container), "rb") as handle:
            handle.seek(256)
            (word,) = struct.unpack("<I", handle.read(4))
        return int(word)

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        """Poll `predicate` until it is true; fail the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.002)

    def stop_all(self) -> None:
        for proc in self._processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def sandbox(build: Build, tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(build, tmp_path)
    box.fake_state.write_bytes(bytes(FAKE_STATE_SIZE))
    try:
        yield box
    finally:
        box.stop_all()


# The start of every ctypes script: the CUDA driver as an application sees it (with libvgpu.so preloaded, every
# symbol looked up here goes through its dlsym), a context on device 0, and small helpers.
PRELUDE = r"""
import ctypes, json, os, struct, sys
from ctypes import POINTER, Structure, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_ulonglong, c_void_p
RESULT = {}
libc = ctypes.CDLL(None)
libc.dlsym.restype = c_void_p
libc.dlsym.argtypes = [c_void_p, c_char_p]

class DlInfo(Structure):
    _fields_ = [("fname", c_char_p), ("fbase", c_void_p), ("sname", c_char_p), ("saddr", c_void_p)]

libc.dladdr.argtypes = [c_void_p, POINTER(DlInfo)]

def where(address):
    info = DlInfo()
    if not address or not libc.dladdr(address, byref(info)):
        return [None, None]
    return [os.path.basename(info.fname.decode()), info.sname.decode() if info.sname else None]

def load_cuda():
    return ctypes.CDLL("libcuda.so.1")

class Location(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class AllocProp(Structure):
    _fields_ = [("type", c_int), ("handle_types", c_int), ("location", Location), ("win32", c_void_p),
                ("flags", ctypes.c_ubyte * 8)]

class PoolProps(Structure):
    _fields_ = [("alloc_type", c_int), ("handle_types", c_int), ("location", Location), ("win32", c_void_p),
                ("max_size", c_size_t), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]

class ArrayDesc(Structure):
    _fields_ = [("width", c_size_t), ("height", c_size_t), ("format", c_int), ("channels", c_uint)]

class Array3DDesc(Structure):
    _fields_ = [("width", c_size_t), ("height", c_size_t), ("depth", c_size_t), ("format", c_int),
                ("channels", c_uint), ("flags", c_uint)]

class Memory(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]

class MemoryV2(Structure):
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong), ("free", c_ulonglong),
                ("used", c_ulonglong)]

def use_device(cuda, device=0):
    ctx = c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(byref(ctx), device) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    return ctx

def accounted(device=0):
    from hami.isolation.accounting import read_accounting
    account = read_accounting(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return account.device(device).memory_used

def really_allocated(device=0):
    with open(os.environ["FAKE_CUDA_STATE"], "rb") as handle:
        return struct.unpack_from("<Q", handle.read(), 256 + 256 * device)[0]
"""
