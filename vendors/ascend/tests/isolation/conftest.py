"""Fixtures of the isolation tests: the installed libvnpu.so in front of a fake Ascend stack built here.

`build` (once per session) finds ``libvnpu.so`` inside the installed ``hami_vendor_ascend`` package (an editable
install has it in the source tree, a wheel in site-packages) and compiles, with the system C compiler, the fake
runtime (``libruntime.so``, the "hardware"), the fake AscendCL (``libascendcl.so``, linked against it and reaching
it through the PLT as the real one does), and the client program the tests and the benchmark drive. `sandbox` (per
test) gives a directory with the fake hardware's shared state file and one accounting file per "container",
environments that preload the library as ``/etc/ld.so.preload`` would, and readers for what the library and the
fake hardware recorded.

To run the same tests against a real NPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real
``libascendcl.so``/``libruntime.so`` (the fake-state readers then skip what only a fake can tell).
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
HOOKS = HERE.parents[1] / "isolation"  # vendors/ascend/isolation (present in a checkout and in copies of it)
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
FAKE_STATE_SIZE = 4096
OOM = 207001  # ACL_ERROR_RT_MEMORY_ALLOCATION

# Every function libvnpu.so hooks: the contract of its export list.
RT_HOOKS = (
    "rtMalloc",
    "rtFree",
    "rtMallocPhysical",
    "rtFreePhysical",
    "rtMemGetInfoEx",
    "rtMemGetInfo",
    "rtSetDevice",
    "rtCtxSetCurrent",
    "rtKernelLaunch",
    "rtKernelLaunchWithFlagV2",
    "rtKernelLaunchWithHandleV2",
    "rtAicpuKernelLaunchExWithArgs",
    "rtAicpuKernelLaunchWithFlag",
    "rtModelExecute",
)
ACL_HOOKS = (
    "aclrtMalloc",
    "aclrtMallocAlign32",
    "aclrtMallocCached",
    "aclrtFree",
    "aclrtMallocPhysical",
    "aclrtFreePhysical",
    "aclrtGetMemInfo",
    "aclrtSetDevice",
    "aclrtSetCurrentContext",
    "aclrtLaunchKernel",
    "aclrtLaunchKernelWithConfig",
    "aclopExecuteV2",
    "aclmdlExecute",
    "aclmdlExecuteAsync",
)
EXPORTS = frozenset({*RT_HOOKS, *ACL_HOOKS})


def installed_library() -> Path:
    """libvnpu.so of the installed hami-vendor-ascend (fails the test run with what to do when missing)."""
    try:
        path = Path(str(importlib.resources.files("hami_vendor_ascend") / "lib" / "libvnpu.so"))
    except ModuleNotFoundError:
        pytest.fail("hami-vendor-ascend is not installed: `uv pip install -e ./vendors/ascend` (or its wheel)")
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist: the package was installed without its isolation library. Reinstall it "
            "(`uv pip install -e ./vendors/ascend` compiles it; a C compiler is needed)"
        )
    if "/src/hami_vendor_ascend/" in path.as_posix():  # an editable install: it may be older than the C sources
        newest = max((*HOOKS.glob("*.[ch]"), *core_sources(), *HOOKS.glob("*.map")), key=lambda p: p.stat().st_mtime)
        if newest.stat().st_mtime > path.stat().st_mtime:
            pytest.fail(
                f"{path} is older than {newest}: rebuild it with `python vendors/ascend/hatch_build.py` "
                "or `uv pip install -e ./vendors/ascend`"
            )
    return path


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not found:
        pytest.skip("the isolation tests build a fake Ascend stack and need a C compiler (cc, gcc or clang)")
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

    directory: Path  # libruntime.so and libascendcl.so (the fakes) live here
    libvnpu: Path
    client: Path
    real_driver: bool  # HAMI_ISOLATION_DRIVER_DIR points at a real stack: fake-only checks skip
    cc: str = "cc"  # the C compiler the fakes were built with
    exports: frozenset[str] = EXPORTS

    def exported(self) -> set[str]:
        """What libvnpu.so really exports."""
        return exported_functions(self.libvnpu)


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    libvnpu = installed_library()
    cc = compiler()
    out = tmp_path_factory.mktemp("isolation-build")

    def compile_(*args: str | Path) -> None:
        proc = subprocess.run([cc, *CFLAGS, *map(str, args)], capture_output=True, text=True, check=False)
        if proc.returncode:
            pytest.fail(f"compiling {args[-1]} failed:\n{proc.stderr}")

    shared = ["-fPIC", "-shared", "-fvisibility=hidden"]
    runtime = out / "libruntime.so"
    compile_(*shared, "-Wl,-Bsymbolic", "-Wl,-soname,libruntime.so", HERE / "fake_runtime.c", "-o", runtime)
    # No -Bsymbolic: AscendCL's calls into the runtime, and into its own exported functions, go through the PLT.
    compile_(*shared, "-Wl,-soname,libascendcl.so", HERE / "fake_acl.c", f"-L{out}", "-lruntime", "-o",
             out / "libascendcl.so")  # fmt: skip
    compile_(HERE / "client.c", f"-L{out}", "-lascendcl", "-lruntime", f"-Wl,-rpath-link,{out}", "-o", out / "client")
    driver_dir = os.environ.get("HAMI_ISOLATION_DRIVER_DIR")
    return Build(
        directory=Path(driver_dir) if driver_dir else out,
        libvnpu=libvnpu,
        client=out / "client",
        real_driver=bool(driver_dir),
        cc=cc,
    )


@pytest.fixture(scope="session")
def exports_of() -> Callable[[Path], set[str]]:
    """What a shared library exports (for libraries a test builds itself)."""
    return exported_functions


@dataclass(frozen=True)
class FakeDevice:
    """One device of the fake hardware, as its shared state says."""

    allocated: int
    peak: int
    launches: int
    busy_ns: tuple[int, ...]
    allocations: int
    host_allocations: int


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
        cores: int | None = None,
        extra: Mapping[str, str] | None = None,
        preload: bool = True,
    ) -> dict[str, str]:
        """The environment of a process of `container`, with the variables Allocate sets in soft-split mode."""
        env = {k: v for k, v in os.environ.items() if k in _PASSED_THROUGH}
        env.update(
            LD_LIBRARY_PATH=str(self.build.directory),
            FAKE_NPU_STATE=str(self.fake_state),
            ASCEND_DEVICE_MEMORY_SHARED_CACHE=str(self.cache(container)),
            LIBVNPU_LOG_LEVEL="0",
        )
        if preload:
            env["LD_PRELOAD"] = str(self.build.libvnpu)
        if memory is not None:
            env["ASCEND_DEVICE_MEMORY_LIMIT_0"] = memory
        if cores is not None:
            env["ASCEND_DEVICE_CORE_LIMIT"] = str(cores)
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
            pytest.skip("only the fake runtime can tell what is really allocated")
        data = self.fake_state.read_bytes()
        base = 256 + 256 * index
        allocated, peak, _, launches = struct.unpack_from("<4Q", data, base)
        busy = struct.unpack_from("<8Q", data, base + 32)
        allocations, host_allocations = struct.unpack_from("<2Q", data, base + 96)
        return FakeDevice(allocated, peak, launches, busy, allocations, host_allocations)

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


# The start of every ctypes script: AscendCL and the runtime as an application sees them (with libvnpu.so
# preloaded, every hooked name resolves to it), device 0 set, and small helpers.
PRELUDE = r"""
import ctypes, json, os, struct, sys
from ctypes import POINTER, Structure, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
RESULT = {}
OOM = 207001

class DrvMemProp(Structure):
    _fields_ = [("side", c_uint32), ("devid", c_uint32), ("module_id", c_uint32), ("pg_type", c_uint32),
                ("mem_type", c_uint32), ("reserve", c_uint64)]

class AclLocation(Structure):
    _fields_ = [("id", c_uint32), ("type", c_int)]

class AclPhysicalProp(Structure):
    _fields_ = [("handle_type", c_int), ("allocation_type", c_int), ("mem_attr", c_int), ("location", AclLocation),
                ("reserve", c_uint64)]

def load_acl():
    # AscendCL and the runtime as a program linked against them sees them: names are looked up in the global
    # scope, where the preloaded libvnpu.so comes first (a lookup on the libraries' own handles finds the real ones).
    ctypes.CDLL("libascendcl.so", mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(None)

load_runtime = load_acl

def use_device(acl, device=0):
    assert acl.aclrtSetDevice(device) == 0

def accounted(device=0):
    from hami.isolation.accounting import read_accounting
    account = read_accounting(os.environ["ASCEND_DEVICE_MEMORY_SHARED_CACHE"])
    return account.device(device).memory_used

def really_allocated(device=0):
    with open(os.environ["FAKE_NPU_STATE"], "rb") as handle:
        return struct.unpack_from("<Q", handle.read(), 256 + 256 * device)[0]
"""
