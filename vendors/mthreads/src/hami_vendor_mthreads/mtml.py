"""The Moore Threads driver binding: the one module of this package that touches MTML (``libmtml.so``, ctypes).

Owns an MTML session and turns its answers into plain values (`MtGpu`), from the opaque-object API of
``mtml.h`` (MTML 2.2): ``mtmlLibraryInit`` / ``mtmlLibraryShutDown``, ``mtmlLibraryCountDevice``, per index
``mtmlLibraryInitDeviceByIndex`` (freed with ``mtmlLibraryFreeDevice``), and of each device
``mtmlDeviceGetIndex``, ``mtmlDeviceGetUUID`` (48-byte buffer), ``mtmlDeviceGetName`` (``MTT S4000``),
``mtmlDeviceGetPciInfo`` (``MtmlPciInfo``: the ``sbdf`` string), ``mtmlDeviceGetProperty`` (``MtmlDeviceProperty``,
bit fields: an MPC parent is a control device, not a GPU to hand out), ``mtmlDeviceCountGpuCores``, the device
node paths (``mtmlDeviceGetGpuPath`` ``/dev/mtgpu.<n>``, ``mtmlDeviceGetPrimaryPath`` ``/dev/dri/card<n>``,
``mtmlDeviceGetRenderPath`` ``/dev/dri/renderD<n>``), the memory object (``mtmlDeviceInitMemory``,
``mtmlMemoryGetTotal`` / ``mtmlMemoryGetUsed`` in bytes, ``mtmlDeviceFreeMemory``), the NUMA node
(``mtmlDeviceGetMemoryAffinityWithinNode``, a bit mask; optional) and the topology between two devices
(``mtmlDeviceGetTopologyLevel``; optional). For the node monitor, each device's readings (`Mtml.readings`):
``mtmlMemoryGetUsed`` (bytes), the GPU object's (``mtmlDeviceInitGpu`` / ``mtmlDeviceFreeGpu``)
``mtmlGpuGetUtilization`` (percent) and ``mtmlGpuGetTemperature`` (degrees Celsius), and
``mtmlDeviceGetPowerUsage`` (milliwatts); a figure the device does not support (``MTML_ERROR_NOT_SUPPORTED``) is
None.

A device whose identity (UUID) cannot be read is not returned (it could never be named; the problem is kept for
the log); one whose memory or paths cannot be read is returned unhealthy, so the scheduler stops placing pods on it
and the node keeps serving the others. Loading: ``libmtml.so`` through the dynamic loader, then MUSA's install
directories, or the configured path; a missing library raises `MtmlUnavailable`, a failing call `MtmlError` naming
the call and its code. Calls are serialized by a lock. Nothing is decided here.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["MtGpu", "Mtml", "MtmlError", "MtmlReport", "MtmlUnavailable", "TopologyLevel"]

LIBRARY = "libmtml.so"
SEARCH_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/musa/lib"), Path("/usr/lib64"))
UUID_BUFFER = 48
NAME_BUFFER = 32
PATH_BUFFER = 64
SBDF_BUFFER = 32
MTML_SUCCESS = 0
MTML_ERROR_NOT_SUPPORTED = 4
MPC_TYPE_PARENT = 1
ERRORS = {
    1: "MTML_ERROR_DRIVER_NOT_LOADED",
    2: "MTML_ERROR_DRIVER_FAILURE",
    3: "MTML_ERROR_INVALID_ARGUMENT",
    4: "MTML_ERROR_NOT_SUPPORTED",
    5: "MTML_ERROR_NO_PERMISSION",
    6: "MTML_ERROR_INSUFFICIENT_SIZE",
    7: "MTML_ERROR_NOT_FOUND",
    8: "MTML_ERROR_INSUFFICIENT_MEMORY",
    9: "MTML_ERROR_DRIVER_TOO_OLD",
    10: "MTML_ERROR_DRIVER_TOO_NEW",
    11: "MTML_ERROR_TIMEOUT",
    12: "MTML_ERROR_RESOURCE_IS_BUSY",
    999: "MTML_ERROR_UNKNOWN",
}


class TopologyLevel:
    """``MtmlDeviceTopologyLevel``: how far apart two devices are (lower is closer)."""

    INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = range(6)


class MtmlError(DriverError):
    """An MTML call failed: `call` is the function, `code` its ``MtmlReturn`` (written by its name)."""

    def code_text(self, code: int) -> str:
        return ERRORS.get(code, str(code))


class MtmlUnavailable(MtmlError, DriverUnavailable):
    """libmtml.so is missing or does not initialize on this host."""


@dataclass(frozen=True)
class MtGpu:
    """One Moore Threads GPU as MTML reports it."""

    index: int
    uuid: str
    name: str
    bdf: str = ""
    memory_total: int = 0
    """Bytes."""
    memory_used: int = 0
    cores: int = 0
    """GPU cores (``mtmlDeviceCountGpuCores``), 0 when unknown."""
    numa: int = 0
    gpu_path: str = ""
    primary_path: str = ""
    render_path: str = ""
    mpc_instance: bool = False
    healthy: bool = True
    problem: str = ""
    """Why the device is unhealthy, empty when it is healthy."""


@dataclass
class MtmlReport:
    gpus: list[MtGpu]
    problems: list[str] = field(default_factory=list)
    topology: dict[tuple[str, str], int] = field(default_factory=dict)
    """(uuid, uuid) → `TopologyLevel`, for the pairs MTML answered."""


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("sbdf", ctypes.c_char * SBDF_BUFFER),
        ("segment", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubsystemId", ctypes.c_uint),
        ("busWidth", ctypes.c_uint),
        ("pciMaxSpeed", ctypes.c_float),
        ("pciCurSpeed", ctypes.c_float),
        ("pciMaxWidth", ctypes.c_uint),
        ("pciCurWidth", ctypes.c_uint),
        ("pciMaxGen", ctypes.c_uint),
        ("pciCurGen", ctypes.c_uint),
        ("rsvd", ctypes.c_int * 6),
    ]


class _Property(ctypes.Structure):
    _fields_ = [
        ("virtCap", ctypes.c_uint, 1),
        ("virtRole", ctypes.c_uint, 3),
        ("mpcCap", ctypes.c_uint, 1),
        ("mpcType", ctypes.c_uint, 3),
        ("mtLinkCap", ctypes.c_uint, 1),
        ("rsvd", ctypes.c_uint, 23),
        ("rsvd2", ctypes.c_uint, 32),
    ]


def _open(configured: Path | None) -> tuple[ctypes.CDLL, str]:
    candidates = [str(configured)] if configured is not None else [LIBRARY, *(str(d / LIBRARY) for d in SEARCH_DIRS)]
    problems = []
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError as exc:
            problems.append(str(exc))
    raise MtmlUnavailable(f"loading {LIBRARY}", -1, "; ".join(problems[:2]))


class Mtml:
    """An MTML session (one ``MtmlLibrary`` object)."""

    def __init__(self, library: ctypes.CDLL, where: str, handle: ctypes.c_void_p) -> None:
        self._lib = library
        self._handle = handle
        self.where = where
        self.lock = threading.Lock()

    @classmethod
    def open(cls, configured: Path | None = None) -> Mtml:
        library, where = _open(configured)
        handle = ctypes.c_void_p()
        fn = getattr(library, "mtmlLibraryInit", None)
        if fn is None:
            raise MtmlUnavailable("mtmlLibraryInit", -1, f"{where} is not MTML (no mtmlLibraryInit)")
        code = fn(ctypes.byref(handle))
        if code != MTML_SUCCESS or not handle.value:
            raise MtmlUnavailable("mtmlLibraryInit", code, f"MTML from {where} does not initialize")
        return cls(library, where, handle)

    def close(self) -> None:
        with self.lock:
            if self._handle.value:
                self._lib.mtmlLibraryShutDown(self._handle)
                self._handle = ctypes.c_void_p()

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise MtmlError(name, -1, "the library has no such function")
        code = fn(*args)
        if code != MTML_SUCCESS:
            raise MtmlError(name, code)

    def _text(self, name: str, device: ctypes.c_void_p, size: int) -> str:
        buffer = ctypes.create_string_buffer(size)
        self._call(name, device, buffer, ctypes.c_uint(size))
        return buffer.value.decode("utf-8", "replace").strip()

    def read(self) -> MtmlReport:
        """Every GPU MTML lists (MPC parents left out), in its order, and the topology between them."""
        with self.lock:
            count = ctypes.c_uint(0)
            self._call("mtmlLibraryCountDevice", self._handle, ctypes.byref(count))
            report = MtmlReport([])
            handles: list[tuple[str, ctypes.c_void_p]] = []
            try:
                for i in range(count.value):
                    device = ctypes.c_void_p()
                    try:
                        self._call("mtmlLibraryInitDeviceByIndex", self._handle, ctypes.c_uint(i), ctypes.byref(device))
                    except MtmlError as exc:
                        report.problems.append(f"MTML device {i}: {exc}; it is not reported")
                        continue
                    gpu = self._gpu(i, device, report.problems)
                    if gpu is None:
                        self._lib.mtmlLibraryFreeDevice(device)
                        continue
                    report.gpus.append(gpu)
                    handles.append((gpu.uuid, device))
                report.topology = self._topology(handles)
            finally:
                for _, device in handles:
                    self._lib.mtmlLibraryFreeDevice(device)
            return report

    def _gpu(self, position: int, device: ctypes.c_void_p, problems: list[str]) -> MtGpu | None:
        try:
            uuid = self._text("mtmlDeviceGetUUID", device, UUID_BUFFER)
        except MtmlError as exc:
            problems.append(f"MTML device {position}: {exc}; without a UUID it is not reported")
            return None
        if not uuid:
            problems.append(f"MTML device {position} has an empty UUID; it is not reported")
            return None
        prop = _Property()
        try:
            self._call("mtmlDeviceGetProperty", device, ctypes.byref(prop))
        except MtmlError:
            prop = _Property()
        if prop.mpcType == MPC_TYPE_PARENT:
            return None  # the MPC parent controls its instances; the instances are the GPUs
        index = ctypes.c_uint(position)
        try:
            self._call("mtmlDeviceGetIndex", device, ctypes.byref(index))
        except MtmlError:
            index = ctypes.c_uint(position)
        values: dict[str, object] = {"index": int(index.value), "uuid": uuid, "mpc_instance": prop.mpcType == 2}
        troubles: list[str] = []
        try:
            values["name"] = self._text("mtmlDeviceGetName", device, NAME_BUFFER)
        except MtmlError as exc:
            values["name"] = ""
            troubles.append(str(exc))
        pci = _PciInfo()
        try:
            self._call("mtmlDeviceGetPciInfo", device, ctypes.byref(pci))
            values["bdf"] = pci.sbdf.decode("ascii", "replace").strip().lower()
        except MtmlError as exc:
            troubles.append(str(exc))
        memory = ctypes.c_void_p()
        try:
            self._call("mtmlDeviceInitMemory", device, ctypes.byref(memory))
            total, used = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
            try:
                self._call("mtmlMemoryGetTotal", memory, ctypes.byref(total))
                self._call("mtmlMemoryGetUsed", memory, ctypes.byref(used))
            finally:
                self._lib.mtmlDeviceFreeMemory(memory)
            values["memory_total"], values["memory_used"] = int(total.value), int(used.value)
        except MtmlError as exc:
            troubles.append(str(exc))
        cores = ctypes.c_uint(0)
        try:
            self._call("mtmlDeviceCountGpuCores", device, ctypes.byref(cores))
            values["cores"] = int(cores.value)
        except MtmlError:
            values["cores"] = 0
        for key, call in (("gpu_path", "mtmlDeviceGetGpuPath"), ("primary_path", "mtmlDeviceGetPrimaryPath"),
                          ("render_path", "mtmlDeviceGetRenderPath")):  # fmt: skip
            try:
                values[key] = self._text(call, device, PATH_BUFFER)
            except MtmlError as exc:
                if exc.code != MTML_ERROR_NOT_SUPPORTED:
                    troubles.append(str(exc))
        nodes = (ctypes.c_ulong * 1)()
        try:
            self._call("mtmlDeviceGetMemoryAffinityWithinNode", device, ctypes.c_uint(1), nodes)
            mask = int(nodes[0])
            values["numa"] = (mask & -mask).bit_length() - 1 if mask else 0
        except MtmlError:
            values["numa"] = 0
        if troubles:
            values["healthy"] = False
            values["problem"] = "; ".join(troubles)
        return MtGpu(**values)  # type: ignore[arg-type]

    def _optional(self, name: str, *args: object) -> bool:
        return optional_call(self._lib, name, *args, unsupported=(MTML_ERROR_NOT_SUPPORTED,), error=MtmlError)

    def readings(self) -> list[DeviceReading]:
        """What MTML reads from each device it lists now (see the module); one without a UUID is left out.

        :raises MtmlError: the devices cannot be listed, or a reading fails other than by not being supported."""
        with self.lock:
            count = ctypes.c_uint(0)
            self._call("mtmlLibraryCountDevice", self._handle, ctypes.byref(count))
            out = []
            for i in range(count.value):
                device = ctypes.c_void_p()
                self._call("mtmlLibraryInitDeviceByIndex", self._handle, ctypes.c_uint(i), ctypes.byref(device))
                try:
                    uuid = self._text("mtmlDeviceGetUUID", device, UUID_BUFFER)
                    if uuid:
                        out.append(self._reading(device, uuid))
                finally:
                    self._lib.mtmlLibraryFreeDevice(device)
            return out

    def _reading(self, device: ctypes.c_void_p, uuid: str) -> DeviceReading:
        used, total = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
        busy, celsius, milliwatts = ctypes.c_uint(0), ctypes.c_int(0), ctypes.c_uint(0)
        has_used = has_total = has_busy = has_celsius = False
        memory, gpu = ctypes.c_void_p(), ctypes.c_void_p()
        if self._optional("mtmlDeviceInitMemory", device, ctypes.byref(memory)):
            try:
                has_used = self._optional("mtmlMemoryGetUsed", memory, ctypes.byref(used))
                has_total = self._optional("mtmlMemoryGetTotal", memory, ctypes.byref(total))
            finally:
                self._lib.mtmlDeviceFreeMemory(memory)
        if self._optional("mtmlDeviceInitGpu", device, ctypes.byref(gpu)):
            try:
                has_busy = self._optional("mtmlGpuGetUtilization", gpu, ctypes.byref(busy))
                has_celsius = self._optional("mtmlGpuGetTemperature", gpu, ctypes.byref(celsius))
            finally:
                self._lib.mtmlDeviceFreeGpu(gpu)
        has_power = self._optional("mtmlDeviceGetPowerUsage", device, ctypes.byref(milliwatts))
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=used.value if has_used else None,
            memory_total_bytes=total.value if has_total else None,
            utilization_percent=busy.value if has_busy else None,
            power_watts=milliwatts.value / 1000 if has_power else None,
            temperature_celsius=celsius.value if has_celsius else None,
        )

    def _topology(self, handles: list[tuple[str, ctypes.c_void_p]]) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        if getattr(self._lib, "mtmlDeviceGetTopologyLevel", None) is None:
            return out
        for i, (a, first) in enumerate(handles):
            for b, second in handles[i + 1 :]:
                level = ctypes.c_int(0)
                if self._lib.mtmlDeviceGetTopologyLevel(first, second, ctypes.byref(level)) == MTML_SUCCESS:
                    out[(a, b)] = out[(b, a)] = int(level.value)
        return out
