"""The sandbox a vendor's isolation-library tests and benchmark run in: the vendor's installed isolation library
preloaded in front of fake vendor libraries built here, over one fake device.

A vendor describes its setup once, as an `IsolationSetup` (in its tests' ``conftest.py``): the installed package
and file of its isolation library, the C sources of its fake libraries and of its client program, and the names of
the environment variables its library and its fakes read. `prepare` (in a test session, `build_for_tests`)
compiles, with the system C compiler, the fakes and the client together with this package's C sources (``csrc/``:
``fake_device.c``, the fake hardware every fake library stands on, and ``isolation_client.c``, the scenarios every
vendor's client shares). `Sandbox` (one per test) gives a directory with the fake hardware's shared state file and
one accounting file per "container", environments that preload the library as ``/etc/ld.so.preload`` would,
processes started in them, and readers for what the library and the fake hardware recorded. A vendor's conftest
is then its setup and one line for the fixtures its tests use, `build` (once per session) and `sandbox` (per
test)::

    SETUP = IsolationSetup(package=..., library=..., fakes=..., client=..., ...)
    build, sandbox = fixtures(SETUP)

To run a vendor's tests against its real libraries, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding
them (the fake-state readers then skip what only a fake can tell). Nothing here names a vendor: every name of a
vendor's API, library or variable comes from its setup.
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
from types import TracebackType
from typing import Any

import pytest

from hami.isolation import accounting
from hami.isolation import source_dir as core_source_dir
from hami.isolation.grant import CONTROL_SIZE

__all__ = [
    "CFLAGS",
    "CSRC",
    "DRIVER_DIR_VARIABLE",
    "FAKE_DEVICE",
    "ISOLATION_CLIENT",
    "Build",
    "CTarget",
    "FakeDevice",
    "IsolationSetup",
    "NoCompilerError",
    "Sandbox",
    "SandboxError",
    "build_for_tests",
    "exported_functions",
    "fake_library",
    "find_compiler",
    "fixtures",
    "prepare",
]

CSRC = Path(__file__).resolve().parent / "csrc"
FAKE_DEVICE = CSRC / "fake_device.c"  # the fake hardware (fake_device.h): compile it into each fake that needs it
ISOLATION_CLIENT = CSRC / "isolation_client.c"  # main and the shared scenarios of the client (isolation_client.h)
CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{CSRC}")
DRIVER_DIR_VARIABLE = "HAMI_ISOLATION_DRIVER_DIR"
FAKE_STATE_SIZE = 4096 + 8 * (32 + 2048 * 32)  # fake_device.h: a 256-byte header, 256 bytes per device, its runs
_PASSED_THROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT")


class SandboxError(Exception):
    """The sandbox cannot be built; the message says what to do."""


class NoCompilerError(SandboxError):
    """No C compiler: the fakes cannot be built on this machine."""


@dataclass(frozen=True)
class CTarget:
    """One file compiled into the build directory: a fake library, the client program, or a helper library."""

    output: str  # its file name in the build directory
    sources: tuple[Path, ...]
    flags: tuple[str, ...] = ()  # before the sources
    link: tuple[str, ...] = ()  # after the sources; "{build}" stands for the build directory


def fake_library(output: str, *sources: Path, symbolic: bool = True, link: tuple[str, ...] = ()) -> CTarget:
    """A fake vendor library: only what its sources mark visible is exported, its soname is its file name, and with
    `symbolic` (-Bsymbolic) its calls to its own functions stay inside it instead of going through the PLT."""
    flags = ("-fPIC", "-shared", "-fvisibility=hidden", *(("-Wl,-Bsymbolic",) if symbolic else ()))
    return CTarget(output, sources, (*flags, f"-Wl,-soname,{output}"), link)


@dataclass(frozen=True)
class IsolationSetup:
    """What one vendor's isolation tests are built from and run with."""

    package: str  # the installed Python package holding the library in its lib/ (hami_vendor_x)
    library: str  # the isolation library's file name (libvx.so)
    project: Path  # the vendor's project directory: its hatch_build.py, and the library's sources in isolation/
    fakes: tuple[CTarget, ...]  # the fake vendor libraries, in build order (a later one may link an earlier one)
    client: CTarget  # the client program (its sources include ISOLATION_CLIENT)
    exports: frozenset[str]  # exactly what the library exports
    fake_prefix: str  # the fakes' variables: <prefix>STATE, <prefix>KERNEL_NS, ... (fake_device.h)
    memory_limit_variable: str  # device memory limit, for every device; <name>_<i> for device i
    core_limit_variable: str  # percent of device time
    accounting_variable: str  # path of the container's accounting file
    log_level_variable: str
    prelude: str  # Python run before every ctypes script of Sandbox.python: the vendor's API as an app sees it
    hooks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # the hooked functions, by API
    helpers: tuple[CTarget, ...] = ()  # further libraries some tests load

    @property
    def fake_state_variable(self) -> str:
        return f"{self.fake_prefix}STATE"

    @property
    def vendor(self) -> str:
        """The vendor's short name (the library's ``hami_iso_vendor.name``, its grant's file name)."""
        return self.package.removeprefix("hami_vendor_")

    @property
    def distribution(self) -> str:
        return self.package.replace("_", "-")

    def installed_library(self) -> Path:
        """The library inside the installed package (an editable install has it in the source tree, a wheel in
        site-packages); refuses one missing, or older than its C sources in an editable install."""
        install = f"`uv pip install -e {_shown(self.project)}`"
        try:
            path = Path(str(importlib.resources.files(self.package) / "lib" / self.library))
        except ModuleNotFoundError:
            raise SandboxError(f"{self.distribution} is not installed: {install} (or its wheel)") from None
        if not path.is_file():
            raise SandboxError(
                f"{path} does not exist: the package was installed without its isolation library. Reinstall it "
                f"({install} compiles it; a C compiler is needed)"
            )
        if f"/src/{self.package}/" in path.as_posix():  # an editable install: it may be older than the C sources
            hooks = self.project / "isolation"
            core = core_source_dir()
            # the core, and each hook layer the library is built on (its hooks name it: hami_<layer>_vendor.h)
            layers = [d for d in core.iterdir() if (hooks / f"hami_{d.name}_vendor.h").is_file()]
            sources = [*core.glob("*.[ch]"), *core.glob("include/*.h"), *(s for d in layers for s in d.glob("*.[ch]"))]
            newest = max((*hooks.glob("*.[ch]"), *sources, *hooks.glob("*.map")), key=lambda p: p.stat().st_mtime)
            if newest.stat().st_mtime > path.stat().st_mtime:
                raise SandboxError(
                    f"{path} is older than {newest}: rebuild it with "
                    f"`python {_shown(self.project / 'hatch_build.py')}` or {install}"
                )
        return path


def _shown(path: Path) -> str:
    try:
        return f"./{path.relative_to(Path.cwd())}"
    except ValueError:
        return str(path)


def find_compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not found:
        raise NoCompilerError("the isolation tests build fake vendor libraries and need a C compiler (cc, gcc, clang)")
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
    """The library under test and what was built around it."""

    setup: IsolationSetup
    directory: Path  # the vendor libraries the client loads (the fakes, or the real ones): LD_LIBRARY_PATH
    output: Path  # what this build compiled
    library: Path  # the installed isolation library
    client: Path
    real_driver: bool  # HAMI_ISOLATION_DRIVER_DIR points at real libraries: fake-only checks skip
    cc: str  # the C compiler the fakes were built with

    @property
    def exports(self) -> frozenset[str]:
        return self.setup.exports

    @property
    def hooks(self) -> Mapping[str, tuple[str, ...]]:
        return self.setup.hooks

    def built(self, name: str) -> Path:
        """A file this build compiled (a helper library, a fake), by its file name."""
        return self.output / name

    def exported(self) -> set[str]:
        """What the library really exports."""
        return exported_functions(self.library)


def prepare(setup: IsolationSetup, out: Path, driver_dir: Path | None = None) -> Build:
    """Find the installed library and compile the fakes, the client and the helpers into `out`. With `driver_dir`,
    the client loads the vendor libraries found there instead of the fakes. Raises SandboxError."""
    library = setup.installed_library()
    cc = find_compiler()
    for target in (*setup.fakes, setup.client, *setup.helpers):
        link = [arg.replace("{build}", str(out)) for arg in target.link]
        argv = [cc, *CFLAGS, *target.flags, *map(str, target.sources), *link, "-o", str(out / target.output)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SandboxError(f"compiling {target.output} failed:\n{' '.join(argv)}\n{proc.stderr}")
    return Build(
        setup=setup,
        directory=driver_dir or out,
        output=out,
        library=library,
        client=out / setup.client.output,
        real_driver=driver_dir is not None,
        cc=cc,
    )


def build_for_tests(setup: IsolationSetup, out: Path) -> Build:
    """`prepare` for a test session: HAMI_ISOLATION_DRIVER_DIR honoured, the session failed with what to do when
    the library is missing or a fake does not compile, skipped without a C compiler."""
    driver_dir = os.environ.get(DRIVER_DIR_VARIABLE)
    try:
        return prepare(setup, out, Path(driver_dir) if driver_dir else None)
    except NoCompilerError as e:
        pytest.skip(str(e))
    except SandboxError as e:
        pytest.fail(str(e))


@dataclass(frozen=True)
class FakeDevice:
    """One device of the fake hardware, as its shared state says (fake_device.h)."""

    allocated: int
    peak: int
    launches: int
    busy_ns: tuple[int, ...]  # by the launching process's tag
    allocations: int
    host_allocations: int


# The start of every ctypes script, before the vendor's prelude: RESULT (what the script leaves for the test) and
# readers of what the library accounted and what the fake device really holds.
_PRELUDE = r"""
import ctypes, json, os, struct, sys
from ctypes import (POINTER, Structure, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint32, c_uint64,
                    c_ulonglong, c_void_p)
RESULT = {}

def accounted(device=0):
    from hami.isolation.accounting import read_accounting
    account = read_accounting(os.environ[ACCOUNTING_VARIABLE])
    return account.device(device).memory_used

def really_allocated(device=0):
    with open(os.environ[FAKE_STATE_VARIABLE], "rb") as handle:
        return struct.unpack_from("<Q", handle.read(), 256 + 256 * device)[0]
"""


@dataclass
class Sandbox:
    """One test's world: fake hardware, containers (accounting files), processes started in them. A context
    manager: entering creates the fake hardware, leaving kills what is still running."""

    build: Build
    root: Path
    _processes: list[subprocess.Popen[str]] = field(default_factory=list)

    def __enter__(self) -> Sandbox:
        self.fake_state.write_bytes(bytes(FAKE_STATE_SIZE))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop_all()

    @property
    def setup(self) -> IsolationSetup:
        return self.build.setup

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
        """The environment of a process of `container`, with the library's variables as Allocate would set them:
        `memory` the limit of device 0, `cores` the percent of device time."""
        env = {k: v for k, v in os.environ.items() if k in _PASSED_THROUGH}
        env.update(
            {
                "LD_LIBRARY_PATH": str(self.build.directory),
                self.setup.fake_state_variable: str(self.fake_state),
                self.setup.accounting_variable: str(self.cache(container)),
                self.setup.log_level_variable: "0",
            }
        )
        if preload:
            env["LD_PRELOAD"] = str(self.build.library)
        if memory is not None:
            env[f"{self.setup.memory_limit_variable}_0"] = memory
        if cores is not None:
            env[self.setup.core_limit_variable] = str(cores)
        env.update(extra or {})
        return env

    def grant_dir(self, container: str = "a") -> Path:
        """Where `container`'s grant directory is (in a pod: the read-only mount at /etc/hami/grant)."""
        return self.root / f"grant-{container}"

    def grant(self, text: str | None, container: str = "a") -> dict[str, str]:
        """Give `container` a grant directory holding `text` as the vendor's grant, and its control words, none set
        (`text` None: the directory without the grant, one expected but missing); the variables that point the
        library at it, for `env`'s extra."""
        directory = self.grant_dir(container)
        directory.mkdir(exist_ok=True)
        path = directory / f"{self.setup.vendor}.grant"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
            (directory / f"{self.setup.vendor}.control").write_bytes(bytes(CONTROL_SIZE))
        return {"HAMI_ISOLATION_GRANT_DIR": str(directory)}

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
        """Run `code` after the preludes in a Python process with `env`; the dict it left in RESULT."""
        names = f"ACCOUNTING_VARIABLE = {self.setup.accounting_variable!r}\n"
        names += f"FAKE_STATE_VARIABLE = {self.setup.fake_state_variable!r}\n"
        script = f"{names}{_PRELUDE}\n{self.setup.prelude}\n{code}\nprint('RESULT ' + json.dumps(RESULT))\n"
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
            pytest.skip("only the fake device can tell what is really allocated")
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


def fixtures(setup: IsolationSetup) -> tuple[Any, Any]:
    """The `build` (per session: `build_for_tests` into a temporary directory) and `sandbox` (per test: a Sandbox
    in the test's temporary directory) fixtures of a vendor's isolation tests: ``build, sandbox = fixtures(SETUP)``
    in their conftest.py."""

    @pytest.fixture(scope="session", name="build")
    def build_fixture(tmp_path_factory: pytest.TempPathFactory) -> Build:
        return build_for_tests(setup, tmp_path_factory.mktemp("isolation-build"))

    @pytest.fixture(name="sandbox")
    def sandbox_fixture(build: Build, tmp_path: Path) -> Iterator[Sandbox]:
        with Sandbox(build, tmp_path) as box:
            yield box

    return build_fixture, sandbox_fixture
