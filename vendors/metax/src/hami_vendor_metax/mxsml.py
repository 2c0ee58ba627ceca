"""The MetaX driver binding: the one module of this package that touches MetaX's management library (ctypes).

Owns a session of MXSML (``libmxsml.so``, ``MxSml.h``), what MetaX's device plugins and ``mx-smi`` read devices
from, and turns its answers into plain values (`MetaxGpu`):

* ``mxSmlInit()``, then ``mxSmlGetDeviceCount()`` (which returns the count itself);
* per index ``mxSmlGetDeviceInfo`` (``mxSmlDeviceInfo_t``: BDF, UUID, device name), ``mxSmlGetMemoryInfo``
  (``mxSmlMemoryInfo_t``, VRAM total and use in KB), ``mxSmlGetDeviceState`` (1 available, 0 not: health);
* per pair ``mxSmlGetDeviceTopology`` (``mxSmlGpuTopologyLevel_t``): `MetaxGpu.metalink` is the set of devices
  the driver reports as ``MXSML_TOPOLOGY_METAXLINK`` to it;
* for the node-side backstop, per index ``mxSmlGetSingleGpuProcess`` (``mxSmlProcessInfo_t``, v1: each process
  with the GPUs it uses, by BDF and sequence label, and the device memory allocated on each, in bytes): the
  memory of a process on this device is its entry for this device's BDF (else its sequence label);
* for the node monitor, per index (`Mxsml.readings`): ``mxSmlGetMemoryInfo`` (VRAM in use),
  ``mxSmlGetDeviceIpUsage(MXSML_Usage_Xcore)`` (the compute cores' busy percent, C-class devices),
  ``mxSmlGetBoardPowerInfo`` (the board's power ways, mW each, added up) and
  ``mxSmlGetTemperatureInfo(MXSML_Temperature_Hotspot)`` (degrees Celsius x 100); a figure the device does not
  support (``MXSML_OperationNotSupport``) is None.

Loading: the library by name through the dynamic loader, then MetaX's install directories (``/opt/mxdriver/lib``,
``/opt/maca/lib``, ``/opt/mxn100/lib``), or the configured path. A missing library or one that finds no device
raises `MxsmlUnavailable`; a failing call `MxsmlError` naming the call and its code. Calls are serialized by a
lock. Nothing is decided here: no model names, no health policy, no link zones.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["MetaxGpu", "Mxsml", "MxsmlError", "MxsmlUnavailable"]

LIBRARY = "libmxsml.so"
SEARCH_DIRS = (Path("/opt/mxdriver/lib"), Path("/opt/maca/lib"), Path("/opt/mxn100/lib"))
MXSML_SUCCESS = 0
MXSML_NO_DEVICE = 2
TOPOLOGY_METAXLINK = 5
MXSML_OPERATION_NOT_SUPPORT = 3
MXSML_INSUFFICIENT_SIZE = 10
USAGE_XCORE = 4  # MXSML_Usage_Xcore
TEMPERATURE_HOTSPOT = 0  # MXSML_Temperature_Hotspot
_POWER_WAYS = 8
_BDF_SIZE, _UUID_SIZE, _NAME_SIZE = 32, 96, 32
_PROCESS_NAME_SIZE, _GPUS_PER_PROCESS = 64, 64


class MxsmlError(DriverError):
    """An MXSML call failed: `call` is the function, `code` its ``mxSmlReturn_t``."""


class MxsmlUnavailable(MxsmlError, DriverUnavailable):
    """The library is missing or finds no device on this host."""


@dataclass(frozen=True)
class MetaxGpu:
    """One MetaX GPU as MXSML (or mx-smi) reports it."""

    index: int
    uuid: str
    bdf: str
    name: str
    """The device name (``MXC500``), which names the model."""
    memory_total: int
    """VRAM, bytes."""
    memory_used: int
    healthy: bool = True
    metalink: frozenset[int] = field(default_factory=frozenset)
    """The indices of the devices linked to this one over MetaXLink."""


class _DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("deviceId", ctypes.c_uint),
        ("type", ctypes.c_uint),
        ("bdfId", ctypes.c_char * _BDF_SIZE),
        ("gpuId", ctypes.c_uint),
        ("nodeId", ctypes.c_uint),
        ("uuid", ctypes.c_char * _UUID_SIZE),
        ("brand", ctypes.c_uint),
        ("mode", ctypes.c_uint),
        ("deviceName", ctypes.c_char * _NAME_SIZE),
    ]


class _MemoryInfo(ctypes.Structure):
    _fields_ = [
        ("visVramTotal", ctypes.c_long),
        ("visVramUse", ctypes.c_long),
        ("vramTotal", ctypes.c_long),
        ("vramUse", ctypes.c_long),
        ("xttTotal", ctypes.c_long),
        ("xttUse", ctypes.c_long),
    ]


class _ProcessGpuInfo(ctypes.Structure):
    _fields_ = [("bdfId", ctypes.c_char * _BDF_SIZE), ("gpuId", ctypes.c_uint), ("gpuMemoryUsage", ctypes.c_ulong)]


class _ProcessInfo(ctypes.Structure):  # mxSmlProcessInfo_t (v1)
    _fields_ = [
        ("processId", ctypes.c_uint),
        ("processName", ctypes.c_char * _PROCESS_NAME_SIZE),
        ("gpuNumber", ctypes.c_uint),
        ("processGpuInfo", _ProcessGpuInfo * _GPUS_PER_PROCESS),
    ]


class _PowerWay(ctypes.Structure):  # mxSmlBoardWayElectricInfo_t
    _fields_ = [("voltage", ctypes.c_uint), ("current", ctypes.c_uint), ("power", ctypes.c_uint)]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()


class Mxsml:
    """An MXSML session."""

    def __init__(self, library: ctypes.CDLL, where: str) -> None:
        self._lib = library
        self.where = where
        self.lock = threading.Lock()
        self._lib.mxSmlGetDeviceCount.restype = ctypes.c_uint
        self._lib.mxSmlGetDeviceCount.argtypes = []

    @classmethod
    def open(cls, configured: Path | None = None) -> Mxsml:
        """Load the library and initialize it. :raises MxsmlUnavailable: missing, or no device found."""
        candidates = (
            [str(configured)] if configured is not None else [LIBRARY, *(str(d / LIBRARY) for d in SEARCH_DIRS)]
        )
        problems = []
        for candidate in candidates:
            try:
                library = ctypes.CDLL(candidate)
            except OSError as exc:
                problems.append(str(exc))
                continue
            if getattr(library, "mxSmlInit", None) is None or getattr(library, "mxSmlGetDeviceCount", None) is None:
                problems.append(f"{candidate} has no mxSmlInit/mxSmlGetDeviceCount")
                continue
            session = cls(library, candidate)
            code = int(library.mxSmlInit())
            if code != MXSML_SUCCESS:
                why = "no MetaX device found" if code == MXSML_NO_DEVICE else "does not initialize"
                raise MxsmlUnavailable("mxSmlInit", code, f"MXSML from {candidate}: {why}")
            return session
        raise MxsmlUnavailable(f"loading {LIBRARY}", -1, "; ".join(problems[:2]))

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise MxsmlError(name, -1, "the library has no such function")
        code = int(fn(*args))
        if code != MXSML_SUCCESS:
            raise MxsmlError(name, code, self._error_string(code))

    def _error_string(self, code: int) -> str:
        fn = getattr(self._lib, "mxSmlGetErrorString", None)
        if fn is None:
            return ""
        fn.restype = ctypes.c_char_p
        text = fn(ctypes.c_uint(code))
        return _text(text) if isinstance(text, bytes) else ""

    def devices(self) -> list[MetaxGpu]:
        """Every device MXSML reports, in its order. :raises MxsmlError: a call failed."""
        with self.lock:
            count = int(self._lib.mxSmlGetDeviceCount())
            infos = []
            for i in range(count):
                index = ctypes.c_uint(i)
                info, memory, state = _DeviceInfo(), _MemoryInfo(), ctypes.c_int(1)
                self._call("mxSmlGetDeviceInfo", index, ctypes.byref(info))
                self._call("mxSmlGetMemoryInfo", index, ctypes.byref(memory))
                self._call("mxSmlGetDeviceState", index, ctypes.byref(state))
                infos.append((info, memory, state.value == 1))
            links: dict[int, set[int]] = {i: set() for i in range(count)}
            for a in range(count):
                for b in range(a + 1, count):
                    level = ctypes.c_uint(0)
                    self._call("mxSmlGetDeviceTopology", ctypes.c_uint(a), ctypes.c_uint(b), ctypes.byref(level))
                    if level.value == TOPOLOGY_METAXLINK:
                        links[a].add(b)
                        links[b].add(a)
            return [
                MetaxGpu(
                    index=i,
                    uuid=_text(info.uuid),
                    bdf=_text(info.bdfId).lower(),
                    name=_text(info.deviceName),
                    memory_total=max(int(memory.vramTotal), 0) * 1024,
                    memory_used=max(int(memory.vramUse), 0) * 1024,
                    healthy=healthy,
                    metalink=frozenset(links[i]),
                )
                for i, (info, memory, healthy) in enumerate(infos)
            ]

    def _optional(self, name: str, *args: object) -> bool:
        return optional_call(self._lib, name, *args, unsupported=(MXSML_OPERATION_NOT_SUPPORT,),
                             error=lambda call, code: MxsmlError(call, code, self._error_string(code)))  # fmt: skip

    def readings(self, index: int, uuid: str) -> DeviceReading:
        """What MXSML reads from device `index` (named `uuid`) now (see the module).

        :raises MxsmlError: a call failed other than by not being supported."""
        with self.lock:
            i = ctypes.c_uint(index)
            memory, busy, hundredths = _MemoryInfo(), ctypes.c_int(0), ctypes.c_int(0)
            ways, size = (_PowerWay * _POWER_WAYS)(), ctypes.c_uint(_POWER_WAYS)
            has_memory = self._optional("mxSmlGetMemoryInfo", i, ctypes.byref(memory))
            has_busy = self._optional("mxSmlGetDeviceIpUsage", i, ctypes.c_uint(USAGE_XCORE), ctypes.byref(busy))
            has_power = self._optional("mxSmlGetBoardPowerInfo", i, ctypes.byref(size), ways)
            has_celsius = self._optional("mxSmlGetTemperatureInfo", i, ctypes.c_uint(TEMPERATURE_HOTSPOT),
                                         ctypes.byref(hundredths))  # fmt: skip
        milliwatts = sum(w.power for w in ways[: min(size.value, _POWER_WAYS)])
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=int(memory.vramUse) * 1024 if has_memory else None,
            memory_total_bytes=int(memory.vramTotal) * 1024 if has_memory else None,
            utilization_percent=busy.value if has_busy else None,
            power_watts=milliwatts / 1000 if has_power else None,
            temperature_celsius=hundredths.value / 100 if has_celsius else None,
        )

    def processes(self, index: int, bdf: str) -> list[tuple[int, int]]:
        """(PID, device memory in bytes) of each process on device `index` (PCI address `bdf`).

        :raises MxsmlError: the call failed."""
        with self.lock:
            room = 32
            for _ in range(4):  # processes may start between two calls: ask again with room for all
                infos = (_ProcessInfo * room)()
                count = ctypes.c_uint(room)
                self._call("mxSmlGetSingleGpuProcess", ctypes.c_uint(index), ctypes.byref(count), infos)
                if count.value < room:
                    break
                room = count.value + 16
            else:
                raise MxsmlError("mxSmlGetSingleGpuProcess", -1, "the process list kept growing")
            found = []
            for info in infos[: count.value]:
                entries = info.processGpuInfo[: min(int(info.gpuNumber), _GPUS_PER_PROCESS)]
                mine = [e for e in entries if _text(e.bdfId).lower() == bdf] if bdf else []
                mine = mine or [e for e in entries if not _text(e.bdfId) and e.gpuId == index]
                found.append((int(info.processId), sum(int(e.gpuMemoryUsage) for e in mine)))
            return found
