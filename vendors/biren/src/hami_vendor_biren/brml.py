"""The one module that talks to BRML, Biren's management library (``libbiren-ml.so``).

From Biren's ``brml.h``: ``brmlInit``, ``brmlDeviceGetCount``, and per index ``brmlDeviceGetHandleByIndex``, then
``brmlDeviceGetUUID`` (at most ``BRML_DEVICE_UUID_BUFFER_SIZE``, 80), ``brmlDeviceGetGpuInfo`` (``brmlGPUInfo_t``:
product name, id, serial, board id, 96 characters each), ``brmlDeviceGetMemoryInfo`` (``brmlMemory_t``: total,
free, used, in bytes) and ``brmlDeviceGetNodeId`` (the card's device node ``/dev/biren/card_<id>``, the id Biren's
device plugin registers the card by). ``brmlErrorString`` words every failure, a `BrmlError` on core's
`hami.vendordriver` pair. For the node monitor, a card's readings (`Brml.readings`): ``brmlDeviceGetMemoryInfo``
(used, bytes), ``brmlDeviceGetUtilizationRates`` (``brmlUtilization_t.gpu``, percent), ``brmlDeviceGetPowerUsage``
(milliwatts) and ``brmlDeviceGetTemperature`` of ``BRML_TEMPERATURE_GPU`` and ``BRML_TEMPERATURE_MEMORY`` (degrees
Celsius); a figure the card does not support (``BRML_ERROR_NOT_SUPPORTED``) is None. The library is loaded by
``brmlLibrary``, or ``libbiren-ml.so`` as the loader finds it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["Brml", "BrmlError", "BrmlUnavailable", "Card"]

DEFAULT_LIBRARY = "libbiren-ml.so"
SUCCESS = 0
NOT_SUPPORTED = 3  # BRML_ERROR_NOT_SUPPORTED
TEMPERATURE_GPU, TEMPERATURE_MEMORY = 0, 1  # brmlTemperatureSensors_t
_UUID = 80


class BrmlError(DriverError):
    """A BRML call failed."""

    library = "BRML"


class BrmlUnavailable(BrmlError, DriverUnavailable):
    """BRML cannot be loaded or initialized here (no Biren driver)."""


class _Memory(ctypes.Structure):  # brmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):  # brmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _GpuInfo(ctypes.Structure):  # brmlGPUInfo_t
    _fields_ = [("name", ctypes.c_char * 96), ("id", ctypes.c_char * 96), ("serial", ctypes.c_char * 96),
                ("board_id", ctypes.c_char * 96)]  # fmt: skip


@dataclass(frozen=True)
class Card:
    """One Biren card as BRML reports it."""

    index: int
    card_id: str
    """``card_<node id>``: its device node under ``/dev/biren`` and the id it is registered by."""
    uuid: str
    name: str
    memory_mib: int


class Brml:
    """An initialized BRML."""

    def __init__(self, lib: ctypes.CDLL, where: str) -> None:
        self._lib = lib
        self.where = where

    @classmethod
    def open(cls, path: Path | None = None) -> Brml:
        """Load and initialize BRML. :raises BrmlUnavailable: it cannot be loaded, is not BRML, or fails to start."""
        where = str(path) if path else DEFAULT_LIBRARY
        try:
            lib = ctypes.CDLL(where)
        except OSError as exc:
            raise BrmlUnavailable(f"BRML ({where}) cannot be loaded", None, str(exc)) from None
        if not hasattr(lib, "brmlInit") or not hasattr(lib, "brmlDeviceGetNodeId"):
            raise BrmlUnavailable(f"{where} is not Biren's BRML (it has no brmlInit)")
        lib.brmlErrorString.restype = ctypes.c_char_p
        lib.brmlDeviceGetHandleByIndex.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        for name in ("brmlDeviceGetUUID", "brmlDeviceGetGpuInfo", "brmlDeviceGetMemoryInfo", "brmlDeviceGetNodeId"):
            getattr(lib, name).argtypes = None
        brml = cls(lib, where)
        code = lib.brmlInit()
        if code != SUCCESS:
            raise BrmlUnavailable("brmlInit", code, brml._message(code))
        return brml

    def _message(self, code: int) -> str:
        text = self._lib.brmlErrorString(code)
        return text.decode(errors="replace") if text else ""

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self._lib, name)(*args)
        if code != SUCCESS:
            raise BrmlError(name, code, self._message(code))

    def count(self) -> int:
        n = ctypes.c_uint()
        self._call("brmlDeviceGetCount", ctypes.byref(n))
        return n.value

    def card(self, index: int) -> Card:
        """Card `index`. :raises BrmlError: a call about it failed."""
        handle = ctypes.c_void_p()
        self._call("brmlDeviceGetHandleByIndex", index, ctypes.byref(handle))
        uuid = ctypes.create_string_buffer(_UUID)
        self._call("brmlDeviceGetUUID", handle, uuid, ctypes.c_uint(_UUID))
        info, memory, node = _GpuInfo(), _Memory(), ctypes.c_uint()
        self._call("brmlDeviceGetGpuInfo", handle, ctypes.byref(info))
        self._call("brmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
        self._call("brmlDeviceGetNodeId", handle, ctypes.byref(node))
        name = info.name.decode(errors="replace").strip()
        return Card(index, f"card_{node.value}", uuid.value.decode(errors="replace").strip(), name,
                    memory.total // (1024 * 1024))  # fmt: skip

    def readings(self, index: int, device_id: str) -> DeviceReading:
        """What BRML reads from card `index` (registered as `device_id`) now (see the module).

        :raises BrmlError: a call failed other than by not being supported."""
        handle = ctypes.c_void_p()
        self._call("brmlDeviceGetHandleByIndex", index, ctypes.byref(handle))

        def optional(name: str, *args: object) -> bool:
            failed = lambda call, code: BrmlError(call, code, self._message(code))  # noqa: E731
            return optional_call(self._lib, name, handle, *args, unsupported=(NOT_SUPPORTED,), error=failed)

        memory, usage, milliwatts = _Memory(), _Utilization(), ctypes.c_uint()
        chip, dram = ctypes.c_uint(), ctypes.c_uint()
        has_memory = optional("brmlDeviceGetMemoryInfo", ctypes.byref(memory))
        has_usage = optional("brmlDeviceGetUtilizationRates", ctypes.byref(usage))
        has_power = optional("brmlDeviceGetPowerUsage", ctypes.byref(milliwatts))
        has_chip = optional("brmlDeviceGetTemperature", ctypes.c_int(TEMPERATURE_GPU), ctypes.byref(chip))
        has_dram = optional("brmlDeviceGetTemperature", ctypes.c_int(TEMPERATURE_MEMORY), ctypes.byref(dram))
        return DeviceReading(
            device_uuid=device_id,
            memory_used_bytes=memory.used if has_memory else None,
            memory_total_bytes=memory.total if has_memory else None,
            utilization_percent=usage.gpu if has_usage else None,
            power_watts=milliwatts.value / 1000 if has_power else None,
            temperature_celsius=chip.value if has_chip else None,
            memory_temperature_celsius=dram.value if has_dram else None,
        )

    def close(self) -> None:
        self._lib.brmlShutdown()
