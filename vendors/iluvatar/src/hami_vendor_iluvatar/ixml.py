"""The one module that talks to ixML, Iluvatar CoreX's management library (``libixml.so``).

ixML exports NVML's function names and types (the "IluvatarCorex Management Library", Deep-Spark/go-ixml): this
binding loads it with ctypes by absolute path (CoreX's, or ``ixmlLibrary``; never a bare name, since another
project's XML parser is also called ``libixml.so``: a library without ``nvmlInit_v2`` is refused with that said)
and reads, per GPU, what discovery and container edits need: index, UUID (``GPU-…``), name (``Iluvatar BI-V150S``),
minor number (``/dev/iluvatar<minor>``), memory (bytes), PCI bus id, and whether the GPU answers (a GPU whose
memory query fails is reported unhealthy, the others keep being served); and which chips share a board
(``nvmlDeviceOnSameBoard``); and each GPU's compute processes with the device memory ixML counts for each
(``nvmlDeviceGetComputeRunningProcesses``, NVML's v1 record: PID and bytes), for the node-side backstop; and each
GPU's readings for the node monitor (`Ixml.readings`: memory in use, busy share, power, temperature, as NVML's calls
of those names give them, a figure ixML does not support on the GPU left None). Every
failure is an `IxmlError` naming the call and ixML's own message (``nvmlErrorString``).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["DEFAULT_LIBRARIES", "Gpu", "Ixml", "IxmlError", "IxmlUnavailable", "sysfs_bus_id"]

DEFAULT_LIBRARIES = (Path("/usr/local/corex/lib64/libixml.so"), Path("/usr/local/corex/lib/libixml.so"))
SUCCESS = 0
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
INSUFFICIENT_SIZE = 7  # NVML_ERROR_INSUFFICIENT_SIZE
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE: the memory of a process the library cannot count
_BUFFER = 96


class IxmlError(DriverError):
    """An ixML call failed; the message (given whole, as `call`) names the call and ixML's reason."""


class IxmlUnavailable(IxmlError, DriverUnavailable):
    """ixML cannot be loaded or initialized here (no CoreX driver, or not ixML)."""


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v1_t, what the unversioned call fills
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [
        ("bus_id_legacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pci_device_id", ctypes.c_uint),
        ("pci_subsystem_id", ctypes.c_uint),
        ("bus_id", ctypes.c_char * 32),
    ]


@dataclass(frozen=True)
class Gpu:
    """One CoreX GPU (one chip: a BI-V150 board has two) as ixML reports it."""

    index: int
    uuid: str
    name: str
    minor: int
    memory_total: int
    bus_id: str
    """PCI address in sysfs's form, ``0000:8a:00.0``."""
    healthy: bool = True


def sysfs_bus_id(raw: str) -> str:
    """ixML's ``00000000:8A:00.0`` as sysfs spells it (``0000:8a:00.0``)."""
    parts = raw.strip().lower().split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


class Ixml:
    """An initialized ixML session (thread-safe: calls are serialized)."""

    def __init__(self, library: ctypes.CDLL, where: Path) -> None:
        self._lib = library
        self.where = where
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path | None = None) -> Ixml:
        """Load and initialize ixML from `path`, else CoreX's default places.

        :raises IxmlUnavailable: none loads, the library is not ixML, or nvmlInit_v2 fails."""
        candidates: Sequence[Path] = (path,) if path is not None else DEFAULT_LIBRARIES
        reasons = []
        for candidate in candidates:
            try:
                library = ctypes.CDLL(str(candidate))
            except OSError as exc:
                reasons.append(f"{candidate}: {exc}")
                continue
            if not hasattr(library, "nvmlInit_v2"):
                reasons.append(f"{candidate} has no nvmlInit_v2: it is not CoreX's ixML (an XML parser of the name?)")
                continue
            session = cls(library, candidate)
            session._call("nvmlInit_v2", unavailable=True)
            return session
        raise IxmlUnavailable("cannot load ixML: " + "; ".join(reasons))

    def close(self) -> None:
        with contextlib.suppress(IxmlError):
            self._call("nvmlShutdown")

    def _reason(self, code: int) -> str:
        try:
            describe = self._lib.nvmlErrorString
            describe.restype = ctypes.c_char_p
            text = describe(code)
            return f"{text.decode(errors='replace')} ({code})" if text else f"error {code}"
        except AttributeError:
            return f"error {code}"

    def _call(self, name: str, *args: object, unavailable: bool = False) -> None:
        try:
            function = getattr(self._lib, name)
        except AttributeError:
            raise IxmlError(f"ixML at {self.where} has no {name}") from None
        with self._lock:
            code = function(*args)
        if code != SUCCESS:
            error = IxmlUnavailable if unavailable else IxmlError
            raise error(f"ixML {name} failed: {self._reason(code)}")

    def _optional(self, name: str, *args: object) -> bool:
        """Call `name`; False where ixML does not support it on this GPU (or has lost the GPU, or lacks the call)."""

        def failed(call: str, code: int) -> IxmlError:
            return IxmlError(f"ixML {call} failed: {self._reason(code)}")

        with self._lock:
            return optional_call(self._lib, name, *args, unsupported=(NOT_SUPPORTED, GPU_IS_LOST), error=failed)

    def _text(self, name: str, handle: ctypes.c_void_p) -> str:
        buffer = ctypes.create_string_buffer(_BUFFER)
        self._call(name, handle, buffer, ctypes.c_uint(_BUFFER))
        return buffer.value.decode(errors="replace")

    def count(self) -> int:
        value = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(value))
        return value.value

    def gpu(self, index: int) -> Gpu:
        """GPU `index`. :raises IxmlError: it cannot be named (no handle, no UUID)."""
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        uuid = self._text("nvmlDeviceGetUUID", handle)
        name = self._text("nvmlDeviceGetName", handle)
        minor = ctypes.c_uint()
        self._call("nvmlDeviceGetMinorNumber", handle, ctypes.byref(minor))
        pci = _PciInfo()
        self._call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci))
        memory = _Memory()
        healthy = True
        try:
            self._call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        except IxmlError:
            healthy = False
        return Gpu(index=index, uuid=uuid, name=name, minor=minor.value, memory_total=memory.total,
                   bus_id=sysfs_bus_id(pci.bus_id.decode(errors="replace")), healthy=healthy)  # fmt: skip

    def same_board(self, a: int, b: int) -> bool:
        """Whether GPUs `a` and `b` are chips of one board (``nvmlDeviceOnSameBoard``; a BI-V150 has two)."""
        handles = [ctypes.c_void_p(), ctypes.c_void_p()]
        for index, handle in zip((a, b), handles, strict=True):
            self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        same = ctypes.c_int()
        self._call("nvmlDeviceOnSameBoard", handles[0], handles[1], ctypes.byref(same))
        return bool(same.value)

    def compute_processes(self, index: int) -> list[tuple[int, int]]:
        """(PID, device memory in bytes) of each compute process on GPU `index`; a process whose memory ixML
        cannot count (NVML_VALUE_NOT_AVAILABLE) is left out."""
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        try:
            function = self._lib.nvmlDeviceGetComputeRunningProcesses
        except AttributeError:
            raise IxmlError(f"ixML at {self.where} has no nvmlDeviceGetComputeRunningProcesses") from None
        room = 32
        for _ in range(4):  # processes may start between the calls: grow the buffer a few times
            infos = (_ProcessInfo * room)()
            count = ctypes.c_uint(room)
            with self._lock:
                code = function(handle, ctypes.byref(count), infos)
            if code == SUCCESS:
                return [(p.pid, p.used) for p in infos[: count.value] if p.used != NOT_AVAILABLE]
            if code != INSUFFICIENT_SIZE:
                raise IxmlError(f"ixML nvmlDeviceGetComputeRunningProcesses failed: {self._reason(code)}")
            room = count.value + 16
        raise IxmlError("ixML nvmlDeviceGetComputeRunningProcesses: the process list kept growing")

    def readings(self, index: int, uuid: str) -> DeviceReading:
        """What ixML reads from GPU `index` (named `uuid`) now: ``nvmlDeviceGetMemoryInfo`` (used and total, bytes),
        ``nvmlDeviceGetUtilizationRates`` (busy percent over the driver's last sample period),
        ``nvmlDeviceGetPowerUsage`` (milliwatts, given in watts), ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``
        (degrees Celsius); passed on as read. :raises IxmlError: a call fails other than by not being supported."""
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        memory, rates = _Memory(), _Utilization()
        milliwatts, celsius = ctypes.c_uint(), ctypes.c_uint()
        has_memory = self._optional("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        has_rates = self._optional("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(rates))
        has_power = self._optional("nvmlDeviceGetPowerUsage", handle, ctypes.byref(milliwatts))
        has_celsius = self._optional("nvmlDeviceGetTemperature", handle, ctypes.c_int(TEMPERATURE_GPU),
                                     ctypes.byref(celsius))  # fmt: skip
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=memory.used if has_memory else None,
            memory_total_bytes=memory.total if has_memory else None,
            utilization_percent=rates.gpu if has_rates else None,
            power_watts=milliwatts.value / 1000 if has_power else None,
            temperature_celsius=celsius.value if has_celsius else None,
        )

    def driver_version(self) -> str:
        buffer = ctypes.create_string_buffer(_BUFFER)
        self._call("nvmlSystemGetDriverVersion", buffer, ctypes.c_uint(_BUFFER))
        return buffer.value.decode(errors="replace")
