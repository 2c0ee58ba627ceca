"""The one module that talks to AMD SMI (``libamd_smi.so``, ``amdsmi.h``), ROCm's management library.

What HAMi's AMD device plugin asks it, through the same calls, by ctypes: ``amdsmi_init(AMDSMI_INIT_AMD_GPUS)``,
the GPUs through ``amdsmi_get_socket_handles`` and ``amdsmi_get_processor_handles``, and per GPU its UUID
(``amdsmi_get_gpu_device_uuid``, the id HAMi registers), its PCI address (``amdsmi_get_gpu_device_bdf``, the
``amdsmi_bdf_t`` bit fields: function 3 bits, device 5, bus 8, domain 48), its ASIC (``amdsmi_get_gpu_asic_info``:
``market_name``, the model HAMi registers as the type, and ``num_of_compute_units``, its ``devcore``), its VRAM
(``amdsmi_get_gpu_memory_total`` of ``AMDSMI_MEM_TYPE_VRAM``, bytes) and NUMA node
(``amdsmi_topo_get_numa_node_number``, optional: 0 where the library cannot say). Struct layouts are those of
``include/amd_smi/amdsmi.h`` (ROCm/amdsmi); the ASIC buffer is passed larger than the struct, so a library whose
struct grew at its end is read the same. For the node monitor, each GPU's readings (`AmdSmi.readings`):
``amdsmi_get_gpu_memory_usage`` (VRAM in use, bytes), ``amdsmi_get_gpu_activity`` (``gfx_activity``, percent),
``amdsmi_get_power_info`` (``current_socket_power`` in watts, else ``average_socket_power``: the header sets the one
a card does not support to UINT32_MAX) and ``amdsmi_get_temp_metric`` (the edge sensor's current temperature,
degrees Celsius); a figure the library does not support (``AMDSMI_STATUS_NOT_SUPPORTED``) is None.

The library is loaded by absolute path (``amdSmiLibrary``, else ROCm's ``/opt/rocm/lib``) or by name. A missing
library, or one that does not initialize, is `AmdSmiUnavailable`; a failing call, `AmdSmiError` naming the call and
its status (core's `hami.vendordriver` pair). Calls are serialized by a lock. Nothing is decided here: no health
policy, no device files.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["DEFAULT_LIBRARIES", "AmdSmi", "AmdSmiError", "AmdSmiUnavailable", "Gpu", "bdf_text"]

DEFAULT_LIBRARIES = (Path("/opt/rocm/lib/libamd_smi.so"), Path("/opt/rocm/lib64/libamd_smi.so"), Path("libamd_smi.so"))
INIT_AMD_GPUS = 1 << 1
MEM_TYPE_VRAM = 0
UUID_SIZE = 38  # AMDSMI_GPU_UUID_SIZE
NOT_SUPPORTED_CU = 0xFFFFFFFF
STATUS_NOT_SUPPORTED = 2
UNSUPPORTED_U32 = 0xFFFFFFFF
TEMPERATURE_TYPE_EDGE = 0
TEMP_CURRENT = 0
_MAX_HANDLES = 256


class AmdSmiError(DriverError):
    """An AMD SMI call failed: `call` is the function, `code` its ``amdsmi_status_t``."""

    library = "AMD SMI"


class AmdSmiUnavailable(AmdSmiError, DriverUnavailable):
    """AMD SMI cannot be loaded or initialized here (no ROCm, or no amdgpu driver)."""


class _EngineUsage(ctypes.Structure):  # amdsmi_engine_usage_t
    _fields_ = [("gfx_activity", ctypes.c_uint32), ("umc_activity", ctypes.c_uint32),
                ("mm_activity", ctypes.c_uint32), ("reserved", ctypes.c_uint32 * 13)]  # fmt: skip


class _PowerInfo(ctypes.Structure):  # amdsmi_power_info_t
    _fields_ = [
        ("socket_power", ctypes.c_uint64),
        ("current_socket_power", ctypes.c_uint32),
        ("average_socket_power", ctypes.c_uint32),
        ("gfx_voltage", ctypes.c_uint64),
        ("soc_voltage", ctypes.c_uint64),
        ("mem_voltage", ctypes.c_uint64),
        ("power_limit", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 18),
    ]


class _AsicInfo(ctypes.Structure):  # amdsmi_asic_info_t
    _fields_ = [
        ("market_name", ctypes.c_char * 256),
        ("vendor_id", ctypes.c_uint32),
        ("vendor_name", ctypes.c_char * 64),
        ("subvendor_id", ctypes.c_uint32),
        ("device_id", ctypes.c_uint64),
        ("rev_id", ctypes.c_uint32),
        ("asic_serial", ctypes.c_char * 32),
        ("oam_id", ctypes.c_uint32),
        ("num_of_compute_units", ctypes.c_uint32),
        ("target_graphics_version", ctypes.c_uint64),
        ("reserved", ctypes.c_uint32 * 15),
        ("room", ctypes.c_uint8 * 512),  # not amdsmi.h's: room for fields a later library appends
    ]


@dataclass(frozen=True)
class Gpu:
    """One GPU as AMD SMI reports it."""

    uuid: str
    bdf: str
    """``dddd:bb:dd.f``, lower case, as sysfs names the PCI device."""
    model: str
    """The ASIC's market name (``AMD Instinct MI300X``); empty when the library gives none."""
    compute_units: int
    vram_bytes: int
    numa: int = 0


def bdf_text(packed: int) -> str:
    """The ``dddd:bb:dd.f`` form of an ``amdsmi_bdf_t``."""
    function, device, bus, domain = packed & 0x7, (packed >> 3) & 0x1F, (packed >> 8) & 0xFF, packed >> 16
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


class AmdSmi:
    """An initialized AMD SMI session."""

    def __init__(self, library: ctypes.CDLL, where: str) -> None:
        self._lib = library
        self.where = where
        self.lock = threading.Lock()

    @classmethod
    def open(cls, configured: Path | None = None) -> AmdSmi:
        """:raises AmdSmiUnavailable: no library loads from `configured` (or ROCm's paths), or it does not
        initialize."""
        candidates = [configured] if configured is not None else list(DEFAULT_LIBRARIES)
        problems = []
        for candidate in candidates:
            try:
                library = ctypes.CDLL(str(candidate))
            except OSError as exc:
                problems.append(str(exc))
                continue
            session = cls(library, str(candidate))
            try:
                session._call("amdsmi_init", ctypes.c_uint64(INIT_AMD_GPUS))
            except AmdSmiError as exc:
                raise AmdSmiUnavailable(exc.call, exc.code, f"AMD SMI from {candidate} does not initialize") from None
            return session
        raise AmdSmiUnavailable("loading libamd_smi.so", None, "; ".join(problems[:2]))

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise AmdSmiError(name, None, f"{self.where} has no such function")
        code = fn(*args)
        if code != 0:
            raise AmdSmiError(name, code)

    def _handles(self, call: str, *first: object) -> list[ctypes.c_void_p]:
        count = ctypes.c_uint32(_MAX_HANDLES)
        handles = (ctypes.c_void_p * _MAX_HANDLES)()
        self._call(call, *first, ctypes.byref(count), handles)
        return [ctypes.c_void_p(handles[i]) for i in range(min(count.value, _MAX_HANDLES))]

    def gpus(self) -> list[Gpu | AmdSmiError]:
        """Every GPU in AMD SMI's order; a GPU one of whose calls fails is that error in its place.

        :raises AmdSmiError: the GPUs cannot be listed."""
        with self.lock:
            processors = [p for s in self._handles("amdsmi_get_socket_handles")
                          for p in self._handles("amdsmi_get_processor_handles", s)]  # fmt: skip
            out: list[Gpu | AmdSmiError] = []
            for handle in processors:
                try:
                    out.append(self._gpu(handle))
                except AmdSmiError as exc:
                    out.append(exc)
            return out

    def readings(self) -> list[DeviceReading]:
        """What AMD SMI reads from each GPU now (see the module); a GPU that cannot be named is left out.

        :raises AmdSmiError: the GPUs cannot be listed, or a reading fails other than by not being supported."""
        with self.lock:
            processors = [p for s in self._handles("amdsmi_get_socket_handles")
                          for p in self._handles("amdsmi_get_processor_handles", s)]  # fmt: skip
            out = []
            for handle in processors:
                uuid = ctypes.create_string_buffer(UUID_SIZE + 2)
                length = ctypes.c_uint(UUID_SIZE + 2)
                if self._optional("amdsmi_get_gpu_device_uuid", handle, ctypes.byref(length), uuid):
                    out.append(self._reading(handle, uuid.value.decode("ascii", "replace").strip()))
            return out

    def _optional(self, name: str, *args: object) -> bool:
        return optional_call(self._lib, name, *args, unsupported=(STATUS_NOT_SUPPORTED,), error=AmdSmiError)

    def _reading(self, handle: ctypes.c_void_p, uuid: str) -> DeviceReading:
        used, total, celsius = ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_int64(0)
        usage, power = _EngineUsage(), _PowerInfo()
        has_used = self._optional("amdsmi_get_gpu_memory_usage", handle, MEM_TYPE_VRAM, ctypes.byref(used))
        has_total = self._optional("amdsmi_get_gpu_memory_total", handle, MEM_TYPE_VRAM, ctypes.byref(total))
        has_usage = self._optional("amdsmi_get_gpu_activity", handle, ctypes.byref(usage))
        has_power = self._optional("amdsmi_get_power_info", handle, ctypes.byref(power))
        has_celsius = self._optional("amdsmi_get_temp_metric", handle, ctypes.c_int(TEMPERATURE_TYPE_EDGE),
                                     ctypes.c_int(TEMP_CURRENT), ctypes.byref(celsius))  # fmt: skip
        watts = None
        if has_power:
            given = [w for w in (power.current_socket_power, power.average_socket_power) if w != UNSUPPORTED_U32]
            watts = float(given[0]) if given else None
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=used.value if has_used else None,
            memory_total_bytes=total.value if has_total else None,
            utilization_percent=usage.gfx_activity if has_usage else None,
            power_watts=watts,
            temperature_celsius=celsius.value if has_celsius else None,
        )

    def _gpu(self, handle: ctypes.c_void_p) -> Gpu:
        uuid = ctypes.create_string_buffer(UUID_SIZE + 2)
        length = ctypes.c_uint(UUID_SIZE + 2)
        self._call("amdsmi_get_gpu_device_uuid", handle, ctypes.byref(length), uuid)
        bdf = ctypes.c_uint64(0)
        self._call("amdsmi_get_gpu_device_bdf", handle, ctypes.byref(bdf))
        asic = _AsicInfo()
        self._call("amdsmi_get_gpu_asic_info", handle, ctypes.byref(asic))
        vram = ctypes.c_uint64(0)
        self._call("amdsmi_get_gpu_memory_total", handle, MEM_TYPE_VRAM, ctypes.byref(vram))
        numa = ctypes.c_uint32(0)
        try:
            self._call("amdsmi_topo_get_numa_node_number", handle, ctypes.byref(numa))
        except AmdSmiError:
            numa.value = 0
        units = asic.num_of_compute_units
        return Gpu(
            uuid=uuid.value.decode("ascii", "replace").strip(),
            bdf=bdf_text(bdf.value),
            model=asic.market_name.decode("utf-8", "replace").strip(),
            compute_units=0 if units == NOT_SUPPORTED_CU else int(units),
            vram_bytes=int(vram.value),
            numa=int(numa.value) if numa.value < 0xFFFF else 0,
        )
