"""The one module that talks to Enflame's management interface: EFML (``libefml.so``), else the ``efsmi`` tool.

EFML (Enflame's ``efml.h``) numbers GCUs ``0…EfmlGetDevCount()-1`` and answers per index; this binding loads it with
ctypes (``efmlLibrary``, or ``libefml.so`` as the loader finds it), calls ``EfmlInit(false)`` (with the driver), and
reads what discovery and container edits need: name (``EfmlGetDevName``, ``S60``), UUID (``EfmlGetDevUuid``),
memory (``EfmlGetDevMem``: ``efmlDevMemInfo_t.mem_total_size``, in MiB as ``efsmi`` prints it), health
(``EfmlGetDevIsHealth``), PCI address (``EfmlGetDevInfo``: domain, bus, device, function) and NUMA node
(``EfmlGetNumaNode``, -1 unknown). Strings are ``MAX_CHAR_BUFF_LEN`` (128) buffers. A failure is an `EfmlError`
naming the call, its return code and EFML's own message (``EfmlErrorString``), on core's `hami.vendordriver`
pair. For the node monitor, each GCU's readings (`Efml.readings`): ``EfmlGetDevMem``'s ``mem_used`` (MiB),
``EfmlGetDevDtuUsage`` (percent), ``EfmlGetDevPwr``'s ``cur_pwr_consumption`` (W) and ``EfmlGetDevTemp``'s
``cur_dev_temp`` and ``cur_hbm0_temp`` (degrees Celsius), all floats but the memory; a figure the GCU does not
support (``EFML_ERROR_NOT_SUPPORTED``) is None.

Without EFML, `read_efsmi` reads ``efsmi -q``: one ``DEV ID <i>`` block per GCU with ``Key : value`` lines
(``Dev Name``, ``Dev UUID``, ``Health``, ``Domain``/``Bus``/``Dev``/``Func`` in hex, and ``Mem Size`` from older
drivers or ``Total Size`` from newer ones, ``<n> MiB``). A block that cannot be read (no UUID, a memory that is not
``<n> MiB``) is left out with a problem naming ``efsmi`` and the line; the other GCUs are still reported. A tool
that cannot be run, or reports no GCU block, is a `hami.vendortool.ToolError`.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call
from hami.vendortool import ToolError, run_tool

__all__ = ["Efml", "EfmlError", "EfmlUnavailable", "EfsmiReport", "Gcu", "read_efsmi"]

DEFAULT_LIBRARY = "libefml.so"
SUCCESS = 0
NOT_SUPPORTED = 3  # EFML_ERROR_NOT_SUPPORTED
_BUFFER = 128  # MAX_CHAR_BUFF_LEN


class EfmlError(DriverError):
    """An EFML call failed."""

    library = "EFML"


class EfmlUnavailable(EfmlError, DriverUnavailable):
    """EFML cannot be loaded or initialized here (no Enflame driver)."""


class _MemInfo(ctypes.Structure):  # efmlDevMemInfo_t
    _fields_ = [("mem_total_size", ctypes.c_uint64), ("mem_used", ctypes.c_uint32)]


class _PowerInfo(ctypes.Structure):  # efmlDevPowerInfo_t
    _fields_ = [("pwr_capability", ctypes.c_float), ("cur_pwr_consumption", ctypes.c_float)]


class _ThermalInfo(ctypes.Structure):  # efmlDevThermalInfo_t
    _fields_ = [("cur_dev_temp", ctypes.c_float), ("cur_hbm0_temp", ctypes.c_float), ("cur_hbm1_temp", ctypes.c_float)]


class _DeviceInfo(ctypes.Structure):  # efmlDeviceInfo_t
    _fields_ = [("name", ctypes.c_char * _BUFFER)] + [
        (f, ctypes.c_uint32) for f in ("vendor_id", "device_id", "domain_id", "bus_id", "dev_id", "func_id", "logic_id")
    ]


@dataclass(frozen=True)
class Gcu:
    """One GCU as the driver reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    healthy: bool = True
    bus_id: str = ""
    numa: int | None = None


class Efml:
    """An initialized EFML."""

    def __init__(self, lib: ctypes.CDLL, where: str) -> None:
        self._lib = lib
        self.where = where

    @classmethod
    def open(cls, path: Path | None = None) -> Efml:
        """Load and initialize EFML. :raises EfmlUnavailable: it cannot be loaded, is not EFML, or fails to start."""
        where = str(path) if path else DEFAULT_LIBRARY
        try:
            lib = ctypes.CDLL(where)
        except OSError as exc:
            raise EfmlUnavailable(f"EFML ({where}) cannot be loaded", None, str(exc)) from None
        if not hasattr(lib, "EfmlInit") or not hasattr(lib, "EfmlGetDevCount"):
            raise EfmlUnavailable(f"{where} is not Enflame's EFML (it has no EfmlInit)")
        lib.EfmlInit.argtypes = [ctypes.c_bool]
        efml = cls(lib, where)
        code = lib.EfmlInit(False)
        if code != SUCCESS:
            raise EfmlUnavailable("EfmlInit", code, efml._message(code))
        return efml

    def _message(self, code: int) -> str:
        text = ctypes.create_string_buffer(_BUFFER)
        if self._lib.EfmlErrorString(code, text) == SUCCESS and text.value:
            return text.value.decode(errors="replace")
        return ""

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self._lib, name)(*args)
        if code != SUCCESS:
            raise EfmlError(name, code, self._message(code))

    def count(self) -> int:
        n = ctypes.c_uint32()
        self._call("EfmlGetDevCount", ctypes.byref(n))
        return n.value

    def _text(self, name: str, index: int) -> str:
        buf = ctypes.create_string_buffer(_BUFFER)
        self._call(name, ctypes.c_uint32(index), buf)
        return buf.value.decode(errors="replace").strip()

    def gcu(self, index: int) -> Gcu:
        """GCU `index`; one whose health cannot be read is reported unhealthy. :raises EfmlError: no UUID, name or
        memory."""
        i = ctypes.c_uint32(index)
        uuid = self._text("EfmlGetDevUuid", index)
        if not uuid:
            raise EfmlError("EfmlGetDevUuid", None, f"GCU {index} has no UUID")
        memory = _MemInfo()
        self._call("EfmlGetDevMem", i, ctypes.byref(memory))
        healthy = ctypes.c_bool(False)
        try:
            self._call("EfmlGetDevIsHealth", i, ctypes.byref(healthy))
        except EfmlError:
            healthy = ctypes.c_bool(False)
        info, numa = _DeviceInfo(), ctypes.c_int(-1)
        try:
            self._call("EfmlGetDevInfo", i, ctypes.byref(info))
            bus = f"{info.domain_id:04x}:{info.bus_id:02x}:{info.dev_id:02x}.{info.func_id:x}"
        except EfmlError:
            bus = ""
        try:
            self._call("EfmlGetNumaNode", i, ctypes.byref(numa))
        except EfmlError:
            numa = ctypes.c_int(-1)
        return Gcu(index, uuid, self._text("EfmlGetDevName", index), int(memory.mem_total_size),
                   bool(healthy.value), bus, numa.value if numa.value >= 0 else None)  # fmt: skip

    def readings(self, index: int, uuid: str) -> DeviceReading:
        """What EFML reads from GCU `index` (named `uuid`) now (see the module).

        :raises EfmlError: a call failed other than by not being supported."""
        i = ctypes.c_uint32(index)

        def optional(name: str, *args: object) -> bool:
            failed = lambda call, code: EfmlError(call, code, self._message(code))  # noqa: E731
            return optional_call(self._lib, name, i, *args, unsupported=(NOT_SUPPORTED,), error=failed)

        memory, busy, power, thermal = _MemInfo(), ctypes.c_float(0), _PowerInfo(), _ThermalInfo()
        has_memory = optional("EfmlGetDevMem", ctypes.byref(memory))
        has_busy = optional("EfmlGetDevDtuUsage", ctypes.byref(busy))
        has_power = optional("EfmlGetDevPwr", ctypes.byref(power))
        has_thermal = optional("EfmlGetDevTemp", ctypes.byref(thermal))
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=int(memory.mem_used) << 20 if has_memory else None,
            memory_total_bytes=int(memory.mem_total_size) << 20 if has_memory else None,
            utilization_percent=busy.value if has_busy else None,
            power_watts=power.cur_pwr_consumption if has_power else None,
            temperature_celsius=thermal.cur_dev_temp if has_thermal else None,
            memory_temperature_celsius=thermal.cur_hbm0_temp if has_thermal else None,
        )

    def close(self) -> None:
        self._lib.EfmlShutdown()


@dataclass
class EfsmiReport:
    gcus: list[Gcu]
    problems: list[str]


_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ]*?)\s*:\s*(.*?)\s*$")
_MIB = re.compile(r"^([0-9]+)\s*MiB$")


def read_efsmi(tool: str = "efsmi") -> EfsmiReport:
    """The GCUs ``efsmi -q`` reports. :raises ToolError: the tool cannot be run or reports no GCU block."""
    return parse_efsmi(run_tool(tool, ["-q"]), tool)


def parse_efsmi(text: str, tool: str = "efsmi") -> EfsmiReport:
    """The GCUs of ``efsmi -q``'s output (see the module)."""
    blocks: list[tuple[int, int, dict[str, tuple[int, str]]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        head = re.fullmatch(r"\s*DEV ID\s+([0-9]+)\s*", line)
        if head:
            blocks.append((number, int(head.group(1)), {}))
        elif blocks and (m := _LINE.match(line)):
            blocks[-1][2].setdefault(m.group(1), (number, m.group(2)))
    if not blocks:
        raise ToolError(f"{tool} -q reports no GCU (no 'DEV ID' line)")
    gcus, problems = [], []
    for start, index, fields in blocks:
        try:
            gcus.append(_gcu(index, fields, start))
        except ValueError as exc:
            problems.append(f"{tool} -q: GCU {index} is not reported: {exc}")
    return EfsmiReport(gcus, problems)


def _gcu(index: int, fields: dict[str, tuple[int, str]], start: int) -> Gcu:
    uuid = fields.get("Dev UUID", (start, ""))[1]
    if not uuid or re.search(r"[\s,:;]", uuid):
        raise ValueError(f"line {fields.get('Dev UUID', (start, ''))[0]}: no usable 'Dev UUID' ({uuid!r})")
    line, memory = fields.get("Total Size") or fields.get("Mem Size") or (start, "")
    size = _MIB.match(memory)
    if size is None:
        raise ValueError(f"line {line}: memory {memory!r} is not '<n> MiB'")
    try:
        bus = "{:04x}:{:02x}:{:02x}.{:x}".format(*(int(fields[k][1], 16) for k in ("Domain", "Bus", "Dev", "Func")))
    except (KeyError, ValueError):
        bus = ""
    healthy = fields.get("Health", (start, "True"))[1].lower() == "true"
    return Gcu(index, uuid, fields.get("Dev Name", (start, ""))[1], int(size.group(1)), healthy, bus)
