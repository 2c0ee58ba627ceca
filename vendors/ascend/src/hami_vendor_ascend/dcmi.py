"""The Ascend driver binding: the one module of this package that touches DCMI (``libdcmi.so``, through ctypes).

Owns a DCMI session (`Dcmi`) and turns what DCMI answers into plain, typed values (`NpuChip`: card and device
ids, logic and physical ids, chip type and name, AI cores, health, the die id that is the NPU's UUID, memory).
Every other module works on these values, so a fake ``libdcmi.so`` built by the tests stands in for the driver.

The calls are DCMI's documented C interface (``dcmi_interface_api.h``): ``dcmi_init``; the cards from
``dcmi_get_card_list`` (``dcmi_get_card_num_list`` on older drivers); per card ``dcmi_get_device_num_in_card``; per
chip ``dcmi_get_device_logic_id``, ``dcmi_get_device_phyid_from_logicid``, ``dcmi_get_device_chip_info``,
``dcmi_get_device_health`` (0 is healthy), the virtual die id ``dcmi_get_device_die_v2(..., VDIE)``
(``dcmi_get_device_die`` on older drivers) written as HAMi and mind-cluster write UUIDs (five 32-bit words in
upper-case hex, eight digits each, joined by ``-``), and the memory from ``dcmi_get_device_hbm_info`` (HBM chips)
or ``dcmi_get_device_memory_info_v3`` (310P's DDR), in MB. For the node-side backstop, a chip's processes:
``dcmi_get_device_resource_info`` (``struct dcmi_proc_mem_info``: the host PID and the memory in bytes, the
device OS's share for the process included; at most 32 processes, DCMI documents). For the node monitor, a chip's
readings (`Dcmi.readings`): memory in use (``dcmi_get_device_hbm_info``'s ``memory_usage``, or 310P's DDR size less
``memory_available``, MB), ``dcmi_get_device_utilization_rate`` of the AI cores (input type 2, percent),
``dcmi_get_device_power_info`` (0.1 W) and ``dcmi_get_device_temperature`` (degrees Celsius); a figure the chip does
not support (``DCMI_ERR_CODE_NOT_SUPPORT``, -8255) is None.

Loading: ``libdcmi.so`` through the dynamic loader (``LD_LIBRARY_PATH``, ``ldconfig``), then the driver's own
directory, or the configured path. A missing library raises `DcmiUnavailable`; a failing call `DcmiError` with the
call and its code. A chip whose optional facts cannot be read (no die id, no memory figure) is still returned,
with None for what is unknown. Calls are serialized by a lock, since the node daemon calls discovery and
allocation from different threads. It must not decide anything: no chip names, no health policy, no annotations.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["DRIVER_LIBRARY", "Dcmi", "DcmiError", "DcmiUnavailable", "NpuChip"]

LIBRARY_NAME = "libdcmi.so"
DRIVER_LIBRARY = Path("/usr/local/Ascend/driver/lib64/driver/libdcmi.so")
"""Where the Ascend driver package installs libdcmi.so."""
VDIE = 1
"""`enum dcmi_die_type`: NDIE 0, VDIE 1, DDIE 2. HAMi's device UUID is the VDIE id."""
MAX_CARDS = 64
MAX_PROCESSES = 32
NOT_SUPPORT = -8255
"""DCMI_ERR_CODE_NOT_SUPPORT: the chip cannot give that figure."""
UTILIZATION_AICORE = 2
"""``dcmi_get_device_utilization_rate``'s input type for the AI cores."""
"""DCMI reports at most 32 processes per chip (``dcmi_get_device_resource_info``)."""


class DcmiError(DriverError):
    """A DCMI call failed. `code` is DCMI's return code, `call` the function that failed."""

    library = "DCMI"

    def code_text(self, code: int) -> str:
        return f"code {code}"


class DcmiUnavailable(DcmiError, DriverUnavailable):
    """There is no usable DCMI on this host: the library is missing or does not initialize."""


class _ChipInfo(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_ubyte * 32),
        ("chip_name", ctypes.c_ubyte * 32),
        ("chip_ver", ctypes.c_ubyte * 32),
        ("aicore_cnt", ctypes.c_uint),
    ]


class _HbmInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class _MemoryInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("memory_available", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("hugepagesize", ctypes.c_ulong),
        ("hugepages_total", ctypes.c_ulong),
        ("hugepages_free", ctypes.c_ulong),
        ("utiliza", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 60),
    ]


class _ProcMemInfo(ctypes.Structure):
    _fields_ = [("proc_id", ctypes.c_int), ("proc_mem_usage", ctypes.c_ulong)]


class _DieId(ctypes.Structure):
    _fields_ = [("soc_die", ctypes.c_uint * 5)]


def _text(raw: ctypes.Array[ctypes.c_ubyte]) -> str:
    return bytes(raw).split(b"\0", 1)[0].decode("ascii", "replace").strip()


def die_uuid(words: tuple[int, ...]) -> str:
    """A die id as HAMi and mind-cluster write an NPU's UUID: upper-case hex words of eight digits joined by ``-``."""
    return "-".join(f"{w:08X}" for w in words)


@dataclass(frozen=True, slots=True)
class NpuChip:
    """One NPU (a chip, a die of a 910C module) as the driver describes it."""

    card_id: int
    device_id: int
    """The chip's position within its card."""
    logic_id: int
    phy_id: int
    """The physical id: what the container runtime's ``ASCEND_VISIBLE_DEVICES`` names."""
    chip_type: str
    """``Ascend`` for every NPU."""
    chip_name: str
    """E.g. ``910B3``, ``310P3``: what the configuration's ``chipName`` matches."""
    ai_cores: int | None
    health: int
    """DCMI's health code: 0 healthy, anything else (warning, alarm, critical) not."""
    uuid: str | None
    """The virtual die id, None when the driver cannot tell it."""
    memory_mib: int | None
    """Device memory (HBM, or DDR on 310P), None when the driver cannot tell it."""


class Dcmi:
    """An initialized DCMI session. Open it with `Dcmi.open`."""

    def __init__(self, library: ctypes.CDLL, where: str) -> None:
        self._lib = library
        self.where = where
        self._lock = threading.Lock()

    @classmethod
    def open(cls, library: Path | None = None) -> Dcmi:
        """Load libdcmi.so (the configured `library`, else the loader's, else the driver's directory) and
        initialize it.

        :raises DcmiUnavailable: no library, or dcmi_init fails.
        """
        candidates = [str(library)] if library is not None else [LIBRARY_NAME, str(DRIVER_LIBRARY)]
        problems = []
        for candidate in candidates:
            try:
                loaded = ctypes.CDLL(candidate)
            except OSError as exc:
                problems.append(str(exc))
                continue
            session = cls(loaded, candidate)
            code = session._call("dcmi_init")
            if code != 0:
                raise DcmiUnavailable("dcmi_init", code, f"{candidate} does not initialize (is the NPU driver loaded?)")
            return session
        raise DcmiUnavailable("load", -99999, "; ".join(problems))

    def _call(self, name: str, *args: object) -> int:
        try:
            function = getattr(self._lib, name)
        except AttributeError:
            raise DcmiError(name, -99998, f"{self.where} has no function {name}") from None
        function.restype = ctypes.c_int
        return int(function(*args))

    def _has(self, name: str) -> bool:
        return hasattr(self._lib, name)

    def _check(self, name: str, *args: object) -> None:
        code = self._call(name, *args)
        if code != 0:
            raise DcmiError(name, code)

    def cards(self) -> list[int]:
        """The card ids, in the driver's order."""
        count = ctypes.c_int(0)
        ids = (ctypes.c_int * MAX_CARDS)()
        name = "dcmi_get_card_list" if self._has("dcmi_get_card_list") else "dcmi_get_card_num_list"
        with self._lock:
            self._check(name, ctypes.byref(count), ids, MAX_CARDS)
        return [ids[i] for i in range(max(0, min(count.value, MAX_CARDS)))]

    def chips(self) -> list[NpuChip]:
        """Every NPU of every card, in card order then device order.

        :raises DcmiError: the cards or a chip's ids cannot be read.
        """
        out = []
        for card in self.cards():
            count = ctypes.c_int(0)
            with self._lock:
                self._check("dcmi_get_device_num_in_card", card, ctypes.byref(count))
            for device in range(max(0, count.value)):
                out.append(self.chip(card, device))
        return out

    def chip(self, card: int, device: int) -> NpuChip:
        """One NPU, by card id and position in the card."""
        with self._lock:
            logic = ctypes.c_int(0)
            self._check("dcmi_get_device_logic_id", ctypes.byref(logic), card, device)
            phy = ctypes.c_uint(0)
            self._check("dcmi_get_device_phyid_from_logicid", ctypes.c_uint(logic.value), ctypes.byref(phy))
            info = _ChipInfo()
            self._check("dcmi_get_device_chip_info", card, device, ctypes.byref(info))
            health = ctypes.c_uint(0)
            self._check("dcmi_get_device_health", card, device, ctypes.byref(health))
            return NpuChip(
                card_id=card,
                device_id=device,
                logic_id=logic.value,
                phy_id=int(phy.value),
                chip_type=_text(info.chip_type),
                chip_name=_text(info.chip_name),
                ai_cores=int(info.aicore_cnt) or None,
                health=int(health.value),
                uuid=self._uuid(card, device),
                memory_mib=self._memory(card, device),
            )

    def health(self, card: int, device: int) -> int:
        """The chip's health code now (0 healthy)."""
        code = ctypes.c_uint(0)
        with self._lock:
            self._check("dcmi_get_device_health", card, device, ctypes.byref(code))
        return int(code.value)

    def processes(self, card: int, device: int) -> list[tuple[int, int]]:
        """(host PID, device memory in bytes) of each process on one chip. :raises DcmiError: the call failed."""
        infos = (_ProcMemInfo * (2 * MAX_PROCESSES))()  # room beyond the documented 32, should a driver give more
        count = ctypes.c_int(0)
        with self._lock:
            self._check("dcmi_get_device_resource_info", card, device, infos, ctypes.byref(count))
        return [(int(p.proc_id), int(p.proc_mem_usage)) for p in infos[: max(0, min(count.value, len(infos)))]]

    def readings(self, card: int, device: int, uuid: str) -> DeviceReading:
        """What DCMI reads from one chip (named `uuid`) now (see the module).

        :raises DcmiError: a call failed other than by not being supported."""

        def optional(name: str, *args: object) -> bool:
            return optional_call(self._lib, name, card, device, *args, unsupported=(NOT_SUPPORT,), error=DcmiError)

        busy, tenths, celsius = ctypes.c_uint(0), ctypes.c_int(0), ctypes.c_int(0)
        hbm, ddr = _HbmInfo(), _MemoryInfo()
        used = total = None
        with self._lock:
            if optional("dcmi_get_device_hbm_info", ctypes.byref(hbm)) and hbm.memory_size:
                used, total = int(hbm.memory_usage), int(hbm.memory_size)
            elif optional("dcmi_get_device_memory_info_v3", ctypes.byref(ddr)) and ddr.memory_size:
                used, total = int(ddr.memory_size) - int(ddr.memory_available), int(ddr.memory_size)
            has_busy = optional("dcmi_get_device_utilization_rate", UTILIZATION_AICORE, ctypes.byref(busy))
            has_power = optional("dcmi_get_device_power_info", ctypes.byref(tenths))
            has_celsius = optional("dcmi_get_device_temperature", ctypes.byref(celsius))
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=None if used is None else used << 20,
            memory_total_bytes=None if total is None else total << 20,
            utilization_percent=busy.value if has_busy else None,
            power_watts=tenths.value / 10 if has_power else None,
            temperature_celsius=celsius.value if has_celsius else None,
        )

    def _uuid(self, card: int, device: int) -> str | None:
        die = _DieId()
        if self._has("dcmi_get_device_die_v2"):
            code = self._call("dcmi_get_device_die_v2", card, device, VDIE, ctypes.byref(die))
        elif self._has("dcmi_get_device_die"):
            code = self._call("dcmi_get_device_die", card, device, ctypes.byref(die))
        else:
            return None
        words = tuple(int(w) for w in die.soc_die)
        return die_uuid(words) if code == 0 and any(words) else None

    def _memory(self, card: int, device: int) -> int | None:
        if self._has("dcmi_get_device_hbm_info"):
            hbm = _HbmInfo()
            if self._call("dcmi_get_device_hbm_info", card, device, ctypes.byref(hbm)) == 0 and hbm.memory_size:
                return int(hbm.memory_size)
        if self._has("dcmi_get_device_memory_info_v3"):
            memory = _MemoryInfo()
            code = self._call("dcmi_get_device_memory_info_v3", card, device, ctypes.byref(memory))
            if code == 0 and memory.memory_size:
                return int(memory.memory_size)
        return None
