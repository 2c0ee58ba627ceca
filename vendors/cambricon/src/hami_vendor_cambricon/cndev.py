"""The Cambricon management binding: the one module of this package that touches CNDev (``libcndev.so``, ctypes).

Owns loading CNDev and turning what it answers into plain values (`MluCard`: index, UUID as Cambricon's device
plugin names it, ``MLU-<uuid>``, card name, memory in MiB, MLU cores, health). Every other module works on these
values, so a fake ``libcndev.so`` built by the tests stands in for the driver.

The calls are CNDev's documented C interface (``cndev.h``), as Cambricon's device plugin makes them: the library
loaded ``RTLD_LAZY | RTLD_GLOBAL``, then ``cndevInit(0)``; ``cndevGetDeviceCount`` (``cndevCardInfo_t``: version,
number); per card ``cndevGetDeviceHandleByIndex``, ``cndevGetUUID`` (``cndevUUID_t``: version, a 37-byte
NUL-terminated string, the 64-bit NCS id), ``cndevGetCardNameStringByDevId``, the memory from
``cndevGetMemoryUsageV2`` (no version field; MB) where the library has it, else ``cndevGetMemoryUsage`` (versioned;
MB), ``cndevGetCardHealthState`` (``health`` 0 is a card in trouble) and ``cndevGetCoreCount``. Every versioned
struct is sent with ``version = CNDEV_VERSION_6``.

A missing library raises `CndevUnavailable`; a failing call `CndevError` naming the call and CNDev's code.
Calls are serialized by a lock. Nothing here decides anything: no health policy, no annotations.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DRIVER_LIBRARY", "Cndev", "CndevError", "CndevUnavailable", "MluCard"]

LIBRARY_NAME = "libcndev.so"
DRIVER_LIBRARY = Path("/usr/local/neuware/lib64/libcndev.so")
"""Where Neuware installs libcndev.so ($NEUWARE_HOME/lib64)."""
CNDEV_VERSION_6 = 6
UUID_SIZE = 37
_ERRORS = {
    1: "no driver",
    4: "uninitialized",
    5: "invalid argument",
    6: "invalid device id",
    7: "unknown",
    10: "not supported",
    12: "no devices",
    13: "no permission",
}


class CndevError(Exception):
    """A CNDev call failed. `code` is CNDev's return code, `call` the function that failed."""

    def __init__(self, call: str, code: int) -> None:
        self.call = call
        self.code = code
        what = _ERRORS.get(code, "")
        super().__init__(f"CNDev {call} failed with code {code}{' (' + what + ')' if what else ''}")


class CndevUnavailable(CndevError):
    """There is no usable CNDev on this host: the library is missing or does not initialize."""


class _CardInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("number", ctypes.c_uint32)]


class _Uuid(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("uuid", ctypes.c_uint8 * UUID_SIZE), ("ncsUUID64", ctypes.c_uint64)]


class _MemoryV2(ctypes.Structure):
    _fields_ = [
        ("physicalMemoryTotal", ctypes.c_int64),
        ("physicalMemoryUsed", ctypes.c_int64),
        ("reservedMemory", ctypes.c_int64),
        ("virtualMemoryTotal", ctypes.c_int64),
        ("virtualMemoryUsed", ctypes.c_int64),
        ("globalMemory", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 16),
    ]


class _MemoryV1(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("physicalMemoryTotal", ctypes.c_int64),
        ("physicalMemoryUsed", ctypes.c_int64),
        ("virtualMemoryTotal", ctypes.c_int64),
        ("virtualMemoryUsed", ctypes.c_int64),
        ("channelNumber", ctypes.c_int64),
        ("channelMemoryUsed", ctypes.c_int64 * 20),
        ("globalMemory", ctypes.c_uint64),
    ]


class _Health(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("health", ctypes.c_int32),
        ("deviceState", ctypes.c_int32),
        ("driverState", ctypes.c_int32),
        ("reserved", ctypes.c_int32 * 16),
    ]


class _CoreCount(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("count", ctypes.c_int32)]


@dataclass(frozen=True, slots=True)
class MluCard:
    """One MLU card as CNDev describes it."""

    index: int
    """CNDev's device index, also the N of ``/dev/cambricon_dev<N>``."""
    uuid: str
    """``MLU-<uuid>``, as Cambricon's device plugin names the card."""
    name: str
    """The card name, e.g. ``MLU370-X8``."""
    memory_mib: int
    cores: int
    healthy: bool


class Cndev:
    """An initialized CNDev library."""

    def __init__(self, lib: ctypes.CDLL, where: str) -> None:
        self._lib = lib
        self.where = where
        self._lock = threading.Lock()
        lib.cndevGetCardNameStringByDevId.restype = ctypes.c_char_p
        lib.cndevGetCardNameStringByDevId.argtypes = [ctypes.c_int32]

    @classmethod
    def open(cls, configured: str = "") -> Cndev:
        """Load CNDev (the configured path, else the dynamic loader's ``libcndev.so``, else Neuware's) and init it.

        :raises CndevUnavailable: no library loads, or ``cndevInit`` fails.
        """
        candidates = [configured] if configured else [LIBRARY_NAME, str(DRIVER_LIBRARY)]
        problems = []
        for name in candidates:
            try:
                lib = ctypes.CDLL(name, mode=os.RTLD_LAZY | os.RTLD_GLOBAL)
            except OSError as exc:
                problems.append(str(exc))
                continue
            code = int(lib.cndevInit(ctypes.c_int32(0)))
            if code != 0:
                raise CndevUnavailable("cndevInit", code)
            return cls(lib, name)
        raise CndevUnavailable("load", -1) from OSError("; ".join(problems))

    def _call(self, name: str, *args: object) -> None:
        code = int(getattr(self._lib, name)(*args))
        if code != 0:
            raise CndevError(name, code)

    def _memory_mib(self, handle: ctypes.c_int32) -> int:
        if hasattr(self._lib, "cndevGetMemoryUsageV2"):
            v2 = _MemoryV2()
            self._call("cndevGetMemoryUsageV2", ctypes.byref(v2), handle)
            return int(v2.physicalMemoryTotal)
        v1 = _MemoryV1(version=CNDEV_VERSION_6)
        self._call("cndevGetMemoryUsage", ctypes.byref(v1), handle)
        return int(v1.physicalMemoryTotal)

    def cards(self) -> list[MluCard]:
        """Every card CNDev reports, in its order.

        :raises CndevError: a call failed.
        """
        with self._lock:
            count = _CardInfo(version=CNDEV_VERSION_6)
            self._call("cndevGetDeviceCount", ctypes.byref(count))
            out = []
            for i in range(count.number):
                handle = ctypes.c_int32(0)
                self._call("cndevGetDeviceHandleByIndex", ctypes.c_int32(i), ctypes.byref(handle))
                uuid = _Uuid(version=CNDEV_VERSION_6)
                self._call("cndevGetUUID", ctypes.byref(uuid), handle)
                raw = bytes(uuid.uuid).split(b"\0", 1)[0].decode("ascii", "replace").strip()
                name = self._lib.cndevGetCardNameStringByDevId(handle)
                health = _Health(version=CNDEV_VERSION_6)
                self._call("cndevGetCardHealthState", ctypes.byref(health), handle)
                cores = _CoreCount(version=CNDEV_VERSION_6)
                self._call("cndevGetCoreCount", ctypes.byref(cores), handle)
                out.append(
                    MluCard(
                        index=i,
                        uuid=f"MLU-{raw}" if raw else "",
                        name=(name or b"").decode("ascii", "replace"),
                        memory_mib=self._memory_mib(handle),
                        cores=int(cores.count),
                        healthy=health.health != 0,
                    )
                )
            return out
