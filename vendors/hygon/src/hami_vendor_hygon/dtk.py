"""The Hygon driver binding: the one module of this package that touches DTK's management libraries (ctypes).

Owns two sessions and turns their answers into plain values (`Dcu`, `VirtualDcu`):

* ROCm SMI (``librocm_smi64.so``, ``rocm_smi.h``), what Hygon's DCGM and HAMi's DCU plugin read devices from:
  ``rsmi_init(0)``, ``rsmi_num_monitor_devices``, per index ``rsmi_dev_pci_id_get`` (the BDF packed as
  ``domain << 32 | bus << 8 | device << 3 | function``), ``rsmi_dev_serial_number_get`` (the UUID is
  ``DCU-<serial>``), ``rsmi_dev_id_get`` (the PCI device id, which names the model), ``rsmi_dev_memory_total_get``
  and ``rsmi_dev_memory_usage_get`` for VRAM (bytes), ``rsmi_topo_numa_affinity_get`` (optional: NUMA); for the
  node-side backstop, the compute processes: ``rsmi_compute_process_info_get`` (``rsmi_process_info_t``: PID,
  PASID, VRAM in bytes summed over the process's GPUs, SDMA time, CU occupancy), ``rsmi_compute_process_gpus_get``
  (the device indices a process uses) and, for a process on several DCUs, ``rsmi_compute_process_info_by_device_get``
  (its VRAM on one of them). A library without that last call cannot say how a multi-DCU process's VRAM is split:
  such a process is left out (`Rsmi.processes` returns it in `unsplit`), never counted whole on each DCU; for the
  node monitor, the readings (`Rsmi.readings`): ``rsmi_dev_memory_usage_get`` (VRAM in use),
  ``rsmi_dev_busy_percent_get`` (percent), ``rsmi_dev_power_ave_get`` (sensor 0, microwatts) and
  ``rsmi_dev_temp_metric_get`` (the edge sensor's current temperature, millidegrees Celsius), a figure the library
  does not support (``RSMI_STATUS_NOT_SUPPORTED``) left None;
* Hygon DMI (``libhydmi.so``, ``dmi_virtual.h``), the virtualization interface: ``dmiGetDeviceInfo`` (compute
  units), ``dmiGetDeviceRemainingInfo`` (CUs and bytes not given to virtual devices), ``dmiGetVDeviceCount`` /
  ``dmiGetVDeviceInfo`` (the virtual devices), ``dmiCreateVDevices`` (CUs and MiB) and
  ``dmiDestroySingleVDevice``. DMI is optional: without it devices are still read, and no vDCU is created
  through the driver (the vdev configuration file alone describes it).

Loading: the library by name through the dynamic loader, then DTK's install directories (``/opt/hyhal/lib``,
``/opt/dtk/lib``), or the configured path. A missing library raises `DtkUnavailable`; a failing call `DtkError`
naming the call and its code. Calls are serialized by a lock. Nothing is decided here: no models, no health policy.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["ComputeProcesses", "Dcu", "Dmi", "DtkError", "DtkUnavailable", "Rsmi", "VirtualDcu", "bdf_of"]

RSMI_LIBRARY = "librocm_smi64.so"
DMI_LIBRARY = "libhydmi.so"
SEARCH_DIRS = (
    Path("/opt/hyhal/lib"),
    Path("/usr/local/hyhal/lib"),
    Path("/opt/dtk/lib"),
    Path("/opt/dtk/rocm_smi/lib"),
)
RSMI_MEM_TYPE_VRAM = 0
RSMI_STATUS_NOT_SUPPORTED = 2
RSMI_TEMP_TYPE_EDGE = 0
RSMI_TEMP_CURRENT = 0
RSMI_STATUS_NOT_FOUND = 10
RSMI_STATUS_INSUFFICIENT_SIZE = 11
DMI_NAME_SIZE = 256
DMI_VDEV_NOT_EXIST = 15
DMI_OUT_OF_RESOURCES = 11
_SERIAL_LEN = 64


class DtkError(DriverError):
    """A DTK management call failed: `call` is the function, `code` its status."""


class DtkUnavailable(DtkError, DriverUnavailable):
    """The library is missing or does not initialize on this host."""


@dataclass(frozen=True)
class Dcu:
    """One physical DCU as the management library reports it."""

    index: int
    bdf: str
    serial: str
    device_id: int
    """The PCI device id (``0x55b7`` …), which names the model."""
    memory_total: int
    """VRAM, bytes."""
    memory_used: int
    numa: int = 0
    compute_units: int | None = None
    """From DMI; None without it."""
    drm: tuple[str, str] | None = None
    """The card and render node names a simulated inventory gives; None from a driver (sysfs tells them)."""

    @property
    def uuid(self) -> str:
        return f"DCU-{self.serial}"


@dataclass(frozen=True)
class VirtualDcu:
    """One virtual DCU the driver holds."""

    id: int
    device: int
    compute_units: int
    memory_bytes: int


class _DmiDeviceInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * DMI_NAME_SIZE),
        ("compute_unit_count", ctypes.c_int),
        ("global_mem_size", ctypes.c_size_t),
        ("usage_mem_size", ctypes.c_size_t),
        ("container_id", ctypes.c_uint64),
        ("device_id", ctypes.c_int),
    ]


def bdf_of(packed: int) -> str:
    """The ``dddd:bb:dd.f`` form of ROCm SMI's packed BDF id."""
    domain, bus, device, function = packed >> 32, (packed >> 8) & 0xFF, (packed >> 3) & 0x1F, packed & 0x7
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def _open(name: str, configured: Path | None) -> tuple[ctypes.CDLL, str]:
    candidates = [str(configured)] if configured is not None else [name, *(str(d / name) for d in SEARCH_DIRS)]
    problems = []
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError as exc:
            problems.append(str(exc))
    raise DtkUnavailable(f"loading {name}", -1, "; ".join(problems[:2]))


class Rsmi:
    """A ROCm SMI session."""

    def __init__(self, library: ctypes.CDLL, where: str) -> None:
        self._lib = library
        self.where = where
        self.lock = threading.Lock()

    @classmethod
    def open(cls, configured: Path | None = None) -> Rsmi:
        library, where = _open(RSMI_LIBRARY, configured)
        session = cls(library, where)
        try:
            session._call("rsmi_init", ctypes.c_uint64(0))
        except DtkError as exc:
            raise DtkUnavailable(exc.call, exc.code, f"ROCm SMI from {where} does not initialize") from None
        return session

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise DtkError(name, -1, "the library has no such function")
        code = fn(*args)
        if code != 0:
            raise DtkError(name, code)

    def devices(self) -> list[Dcu]:
        """Every DCU the library monitors, in its order."""
        with self.lock:
            count = ctypes.c_uint32(0)
            self._call("rsmi_num_monitor_devices", ctypes.byref(count))
            out = []
            for i in range(count.value):
                index = ctypes.c_uint32(i)
                bdfid, dev_id = ctypes.c_uint64(0), ctypes.c_uint16(0)
                total, used, numa = ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_int32(0)
                serial = ctypes.create_string_buffer(_SERIAL_LEN)
                self._call("rsmi_dev_pci_id_get", index, ctypes.byref(bdfid))
                self._call("rsmi_dev_serial_number_get", index, serial, ctypes.c_uint32(_SERIAL_LEN))
                self._call("rsmi_dev_id_get", index, ctypes.byref(dev_id))
                self._call("rsmi_dev_memory_total_get", index, RSMI_MEM_TYPE_VRAM, ctypes.byref(total))
                self._call("rsmi_dev_memory_usage_get", index, RSMI_MEM_TYPE_VRAM, ctypes.byref(used))
                try:
                    self._call("rsmi_topo_numa_affinity_get", index, ctypes.byref(numa))
                except DtkError:
                    numa.value = 0
                out.append(
                    Dcu(
                        index=i,
                        bdf=bdf_of(bdfid.value),
                        serial=serial.value.decode("ascii", "replace").strip(),
                        device_id=dev_id.value,
                        memory_total=total.value,
                        memory_used=used.value,
                        numa=max(numa.value, 0),
                    )
                )
            return out

    def _optional(self, name: str, *args: object) -> bool:
        return optional_call(self._lib, name, *args, unsupported=(RSMI_STATUS_NOT_SUPPORTED,), error=DtkError)

    def readings(self, index: int, uuid: str) -> DeviceReading:
        """What ROCm SMI reads from DCU `index` (named `uuid`) now, passed on as read (see the module)."""
        with self.lock:
            i = ctypes.c_uint32(index)
            used, total = ctypes.c_uint64(0), ctypes.c_uint64(0)
            busy, microwatts, millidegrees = ctypes.c_uint32(0), ctypes.c_uint64(0), ctypes.c_int64(0)
            has_used = self._optional("rsmi_dev_memory_usage_get", i, RSMI_MEM_TYPE_VRAM, ctypes.byref(used))
            has_total = self._optional("rsmi_dev_memory_total_get", i, RSMI_MEM_TYPE_VRAM, ctypes.byref(total))
            has_busy = self._optional("rsmi_dev_busy_percent_get", i, ctypes.byref(busy))
            has_power = self._optional("rsmi_dev_power_ave_get", i, ctypes.c_uint32(0), ctypes.byref(microwatts))
            has_celsius = self._optional("rsmi_dev_temp_metric_get", i, ctypes.c_uint32(RSMI_TEMP_TYPE_EDGE),
                                         ctypes.c_int(RSMI_TEMP_CURRENT), ctypes.byref(millidegrees))  # fmt: skip
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=used.value if has_used else None,
            memory_total_bytes=total.value if has_total else None,
            utilization_percent=busy.value if has_busy else None,
            power_watts=microwatts.value / 1e6 if has_power else None,
            temperature_celsius=millidegrees.value / 1000 if has_celsius else None,
        )

    def processes(self) -> ComputeProcesses:
        """Every compute process on the monitored DCUs and its VRAM on each. :raises DtkError: a call failed."""
        with self.lock:
            count = ctypes.c_uint32(0)
            self._call("rsmi_compute_process_info_get", None, ctypes.byref(count))
            for _ in range(4):  # processes may start between two calls: ask again with more room
                room = count.value + 16
                infos = (_ProcessInfo * room)()
                count = ctypes.c_uint32(room)
                code = self._lib.rsmi_compute_process_info_get(infos, ctypes.byref(count))
                if code == 0:
                    break
                if code != RSMI_STATUS_INSUFFICIENT_SIZE:
                    raise DtkError("rsmi_compute_process_info_get", code)
            else:
                raise DtkError("rsmi_compute_process_info_get", RSMI_STATUS_INSUFFICIENT_SIZE, "the list kept growing")
            by_device = getattr(self._lib, "rsmi_compute_process_info_by_device_get", None)
            found: list[tuple[int, int, int]] = []
            unsplit: list[int] = []
            for info in infos[: count.value]:
                pid = int(info.process_id)
                gpus = (ctypes.c_uint32 * 64)()
                used = ctypes.c_uint32(64)
                code = self._lib.rsmi_compute_process_gpus_get(ctypes.c_uint32(pid), gpus, ctypes.byref(used))
                if code == RSMI_STATUS_NOT_FOUND:
                    continue  # it ended between the two calls
                if code != 0:
                    raise DtkError("rsmi_compute_process_gpus_get", code)
                devices = [int(d) for d in gpus[: used.value]]
                if len(devices) == 1:
                    found.append((devices[0], pid, int(info.vram_usage)))
                    continue
                if by_device is None:
                    if devices:
                        unsplit.append(pid)
                    continue
                for device in devices:
                    one = _ProcessInfo()
                    code = by_device(ctypes.c_uint32(pid), ctypes.c_uint32(device), ctypes.byref(one))
                    if code == RSMI_STATUS_NOT_FOUND:
                        continue
                    if code != 0:
                        raise DtkError("rsmi_compute_process_info_by_device_get", code)
                    found.append((device, pid, int(one.vram_usage)))
            return ComputeProcesses(found, unsplit)


class _ProcessInfo(ctypes.Structure):  # rsmi_process_info_t
    _fields_ = [
        ("process_id", ctypes.c_uint32),
        ("pasid", ctypes.c_uint32),
        ("vram_usage", ctypes.c_uint64),
        ("sdma_usage", ctypes.c_uint64),
        ("cu_occupancy", ctypes.c_uint32),
    ]


@dataclass(frozen=True)
class ComputeProcesses:
    """The compute processes ROCm SMI reports: (device index, PID, VRAM bytes) per process and device, and the
    PIDs of processes on several DCUs whose VRAM the library cannot split per device."""

    found: list[tuple[int, int, int]]
    unsplit: list[int]


class Dmi:
    """A Hygon DMI session (virtual devices)."""

    def __init__(self, library: ctypes.CDLL, where: str) -> None:
        self._lib = library
        self.where = where
        self.lock = threading.Lock()

    @classmethod
    def open(cls, configured: Path | None = None) -> Dmi:
        library, where = _open(DMI_LIBRARY, configured)
        session = cls(library, where)
        count = ctypes.c_int(0)
        try:
            session._call("dmiGetDeviceCount", ctypes.byref(count))
        except DtkError as exc:
            raise DtkUnavailable(exc.call, exc.code, f"DMI from {where} cannot open /dev/mkfd") from None
        return session

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise DtkError(name, -1, "the library has no such function")
        code = fn(*args)
        if code != 0:
            raise DtkError(name, code)

    def compute_units(self, device: int) -> int:
        with self.lock:
            info = _DmiDeviceInfo()
            self._call("dmiGetDeviceInfo", ctypes.c_int(device), ctypes.byref(info))
            return int(info.compute_unit_count)

    def remaining(self, device: int) -> tuple[int, int]:
        """CUs and bytes of `device` not given to virtual devices."""
        with self.lock:
            cus, memory = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self._call("dmiGetDeviceRemainingInfo", ctypes.c_int(device), ctypes.byref(cus), ctypes.byref(memory))
            return int(cus.value), int(memory.value)

    def virtual_devices(self) -> list[VirtualDcu]:
        """The virtual devices the driver holds (ids probed up to twice their count, as ids may have gaps)."""
        with self.lock:
            count = ctypes.c_int(0)
            self._call("dmiGetVDeviceCount", ctypes.byref(count))
            out: list[VirtualDcu] = []
            probe = 0
            while len(out) < count.value and probe < max(64, 2 * count.value):
                info = _DmiDeviceInfo()
                code = self._lib.dmiGetVDeviceInfo(ctypes.c_int(probe), ctypes.byref(info))
                if code == 0:
                    out.append(VirtualDcu(probe, int(info.device_id), int(info.compute_unit_count),
                                          int(info.global_mem_size)))  # fmt: skip
                elif code != DMI_VDEV_NOT_EXIST:
                    raise DtkError("dmiGetVDeviceInfo", code)
                probe += 1
            return out

    def create(self, device: int, compute_units: int, memory_mib: int) -> VirtualDcu:
        """Create one virtual device on `device`; returns it (the id the driver gave it)."""
        before = {v.id for v in self.virtual_devices()}
        with self.lock:
            cus, mem = (ctypes.c_int * 1)(compute_units), (ctypes.c_int * 1)(memory_mib)
            self._call("dmiCreateVDevices", ctypes.c_int(device), ctypes.c_int(1), cus, mem)
        created = [v for v in self.virtual_devices() if v.id not in before and v.device == device]
        if not created:
            raise DtkError("dmiCreateVDevices", 0, "the driver reported success but no new virtual device")
        return created[0]

    def destroy(self, vdev: int) -> bool:
        """Destroy virtual device `vdev`; False when it did not exist."""
        with self.lock:
            code = self._lib.dmiDestroySingleVDevice(ctypes.c_int(vdev))
        if code == DMI_VDEV_NOT_EXIST:
            return False
        if code != 0:
            raise DtkError("dmiDestroySingleVDevice", code)
        return True
