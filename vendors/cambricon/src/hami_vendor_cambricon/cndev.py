"""The Cambricon management binding: the one module of this package that touches CNDev (``libcndev.so``, ctypes).

Owns loading CNDev and turning what it answers into plain values (`MluCard`: index, UUID as Cambricon's device
plugin names it, ``MLU-<uuid>``, card name, memory in MiB, MLU cores, health). Every other module works on these
values, so a fake ``libcndev.so`` built by the tests stands in for the driver.

The calls are CNDev's documented C interface (``cndev.h``), as Cambricon's device plugin makes them: the library
loaded ``RTLD_LAZY | RTLD_GLOBAL``, then ``cndevInit(0)``; ``cndevGetDeviceCount`` (``cndevCardInfo_t``: version,
number); per card ``cndevGetDeviceHandleByIndex``, ``cndevGetUUID`` (``cndevUUID_t``: version, a 37-byte
NUL-terminated string, the 64-bit NCS id), ``cndevGetCardNameStringByDevId``, the memory from
``cndevGetMemoryUsageV2`` (no version field; MB) where the library has it, else ``cndevGetMemoryUsage`` (versioned;
MB), ``cndevGetCardHealthState`` (``health`` 0 is a card in trouble), ``cndevGetCoreCount`` and, where the
library has it, ``cndevGetNUMANodeIdByDevId`` (else NUMA 0). Every versioned struct is sent with
``version = CNDEV_VERSION_6``.

The driver's slices (sMLU, what Cambricon's dynamic-sMLU plugin makes at Allocate) go through the same session:
``cndevGetSMLUMode``, ``cndevGetSMluProfileIdInfo`` / ``cndevGetSMluProfileInfo`` (profiles: a quota in percent
and a memory size in bytes), ``cndevCreateSMluProfileInfo`` / ``cndevDestroySMluProfileInfo``,
``cndevCreateSMluInstanceByProfileId`` (a named instance; its handle is ``(instance id << 8) | card``),
``cndevGetAllSMluInstanceInfo`` (asked again with the count CNDev answers when 128 entries are too few) and
``cndevDestroySMluInstanceByHandle``. MLU-Link peers come from ``cndevGetMLULinkPortNumber``,
``cndevGetMLULinkStatusV2`` (a port whose MAC is down is skipped) and ``cndevGetMLULinkRemoteInfo`` (the peer's
UUID), as Cambricon's plugin reads them. A driver without these calls answers `CndevError` ``not supported``.
For the node-side backstop, each card's processes and the device memory each holds: ``cndevGetProcessInfo``
(``cndevProcessInfo_t``: version, PID, physical and virtual memory used in KiB; asked again with the count CNDev
answers when the room given is too little). For the node monitor, each card's readings (`Cndev.readings`): the
memory call's ``physicalMemoryUsed`` (MB), ``cndevGetDeviceUtilizationInfo`` (``averageCoreUtilization``, percent),
``cndevGetDevicePowerInfo`` (``usage``, W) and ``cndevGetTemperatureInfo`` (``board``, the board's hottest sensor,
degrees Celsius); a figure the card does not support (``CNDEV_ERROR_NOT_SUPPORTED``) is None.

A missing library raises `CndevUnavailable`; a failing call `CndevError` naming the call and CNDev's code.
Calls are serialized by a lock. Nothing here decides anything: no health policy, no annotations.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from hami.model import DeviceReading
from hami.vendordriver import DriverError, DriverUnavailable, optional_call

__all__ = ["DRIVER_LIBRARY", "Cndev", "CndevError", "CndevUnavailable", "MluCard", "SmluInstance", "SmluProfile"]

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
    9: "insufficient space",
    10: "not supported",
    11: "invalid link",
    12: "no devices",
    13: "no permission",
    14: "not found",
    15: "in use",
    16: "duplicate",
    18: "in problem",
}
NOT_SUPPORTED = 10
INSUFFICIENT_SPACE = 9
NAME_SIZE = 100
"""CNDEV_MLUINSTANCE_PROFILE_NAME_BUFFER_SIZE and CNDEV_MLUINSTANCE_DEVICE_NODE_NAME_BUFFER_SIZE."""


class CndevError(DriverError):
    """A CNDev call failed. `code` is CNDev's return code, `call` the function that failed."""

    library = "CNDev"

    def code_text(self, code: int) -> str:
        what = _ERRORS.get(code, "")
        return f"code {code}{' (' + what + ')' if what else ''}"


class CndevUnavailable(CndevError, DriverUnavailable):
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


class _Numa(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("nodeId", ctypes.c_int32)]


class _Utilization(ctypes.Structure):  # cndevUtilizationInfo_t
    _fields_ = [("version", ctypes.c_int32), ("averageCoreUtilization", ctypes.c_int32),
                ("coreUtilization", ctypes.c_int32 * 80)]  # fmt: skip


class _Power(ctypes.Structure):  # cndevDevicePowerInfo_t (no version field)
    _fields_ = [("usage", ctypes.c_int32), ("cap", ctypes.c_int32), ("machine", ctypes.c_int32),
                ("tdp", ctypes.c_int32), ("maxPower", ctypes.c_int32), ("reserved", ctypes.c_int32 * 16)]  # fmt: skip


class _Temperature(ctypes.Structure):  # cndevTemperatureInfo_t
    _fields_ = [("version", ctypes.c_int32), ("board", ctypes.c_int32), ("cluster", ctypes.c_int32 * 20),
                ("memoryDie", ctypes.c_int32 * 8), ("chip", ctypes.c_int32), ("airInlet", ctypes.c_int32),
                ("airOutlet", ctypes.c_int32), ("memory", ctypes.c_int32), ("videoInput", ctypes.c_int32),
                ("cpu", ctypes.c_int32), ("isp", ctypes.c_int32)]  # fmt: skip


class _ProcessInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("pid", ctypes.c_uint32), ("physicalMemoryUsed", ctypes.c_uint64),
                ("virtualMemoryUsed", ctypes.c_uint64)]  # fmt: skip


class _SmluMode(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("smluMode", ctypes.c_int32)]


class _SmluSet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("mluQuota", ctypes.c_uint32), ("memorySize", ctypes.c_uint64)]


class _SmluInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("profileId", ctypes.c_int32),
        ("instanceId", ctypes.c_int32),
        ("uuid", ctypes.c_uint8 * UUID_SIZE),
        ("domain", ctypes.c_int32),
        ("bus", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("function", ctypes.c_int32),
        ("profileName", ctypes.c_char * NAME_SIZE),
        ("instanceName", ctypes.c_char * NAME_SIZE),
        ("devNodeName", ctypes.c_char * NAME_SIZE),
        ("mluQuota", ctypes.c_uint32 * 2),
        ("memorySize", ctypes.c_uint64 * 2),
        ("reserved", ctypes.c_uint32 * 128),
    ]


class _SmluProfileIds(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int32), ("count", ctypes.c_int32), ("profileId", ctypes.c_int32 * 128)]


class _SmluProfileInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("profileId", ctypes.c_int32),
        ("name", ctypes.c_char * NAME_SIZE),
        ("totalCapacity", ctypes.c_uint32),
        ("remainCapacity", ctypes.c_uint32),
        ("mluQuota", ctypes.c_uint32 * 2),
        ("memorySize", ctypes.c_uint64 * 2),
    ]


class _LinkStatusV2(ctypes.Structure):
    _fields_ = [
        ("macState", ctypes.c_int32),
        ("serdesState", ctypes.c_int32),
        ("presenceState", ctypes.c_int32),
        ("serdesProgress", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 7),
    ]


class _LinkRemote(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int32),
        ("mcSn", ctypes.c_uint64),
        ("baSn", ctypes.c_uint64),
        ("slotId", ctypes.c_uint32),
        ("portId", ctypes.c_uint32),
        ("devIp", ctypes.c_uint8 * 16),
        ("uuid", ctypes.c_uint8 * UUID_SIZE),
        ("devIpVersion", ctypes.c_uint32),
        ("isIpValid", ctypes.c_uint32),
        ("connectType", ctypes.c_int32),
        ("ncsUUID64", ctypes.c_uint64),
        ("mac_addr", ctypes.c_uint8 * 6),
        ("port_name", ctypes.c_char * 256),
    ]


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()


@dataclass(frozen=True, slots=True)
class SmluProfile:
    """An sMLU profile of one card: what each instance made from it gets."""

    id: int
    quota: int
    """Percent of the card's compute."""
    memory_bytes: int
    remaining: int
    """How many more instances the card can make from it."""
    total: int


@dataclass(frozen=True, slots=True)
class SmluInstance:
    """An sMLU instance (a driver-enforced slice of one card)."""

    card: int
    instance_id: int
    profile_id: int
    name: str
    uuid: str
    """``MLU-<uuid>`` of the instance."""
    device_node: str
    """e.g. ``/dev/cambricon-caps/cap_dev0_mi1``."""
    quota: int
    memory_bytes: int

    @property
    def handle(self) -> int:
        """The instance handle CNDev's calls take: ``(instance id << 8) | card``."""
        return self.instance_id << 8 | self.card


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
    links: tuple[str, ...] = ()
    """The UUIDs this card's MLU-Link ports reach, one entry per port that is up (`Cndev.link_peers`)."""
    numa: int = 0


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

    def _handle(self, index: int) -> ctypes.c_int32:
        handle = ctypes.c_int32(0)
        self._call("cndevGetDeviceHandleByIndex", ctypes.c_int32(index), ctypes.byref(handle))
        return handle

    def _has(self, *names: str) -> None:
        for name in names:
            if not hasattr(self._lib, name):
                raise CndevError(name, NOT_SUPPORTED)

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
                numa = _Numa(version=CNDEV_VERSION_6)
                if hasattr(self._lib, "cndevGetNUMANodeIdByDevId"):
                    self._call("cndevGetNUMANodeIdByDevId", ctypes.byref(numa), handle)
                out.append(
                    MluCard(
                        index=i,
                        uuid=f"MLU-{raw}" if raw else "",
                        name=(name or b"").decode("ascii", "replace"),
                        memory_mib=self._memory_mib(handle),
                        cores=int(cores.count),
                        healthy=health.health != 0,
                        numa=max(0, int(numa.nodeId)),
                    )
                )
            return out

    def readings(self, index: int, uuid: str) -> DeviceReading:
        """What CNDev reads from card `index` (named `uuid`) now (see the module).

        :raises CndevError: a call failed other than by not being supported."""

        def optional(name: str, *args: object) -> bool:
            return optional_call(self._lib, name, *args, unsupported=(NOT_SUPPORTED,), error=CndevError)

        with self._lock:
            handle = self._handle(index)
            v2, v1 = _MemoryV2(), _MemoryV1(version=CNDEV_VERSION_6)
            usage, power = _Utilization(version=CNDEV_VERSION_6), _Power()
            celsius = _Temperature(version=CNDEV_VERSION_6)
            if hasattr(self._lib, "cndevGetMemoryUsageV2"):
                has_memory = optional("cndevGetMemoryUsageV2", ctypes.byref(v2), handle)
                used, total = v2.physicalMemoryUsed, v2.physicalMemoryTotal
            else:
                has_memory = optional("cndevGetMemoryUsage", ctypes.byref(v1), handle)
                used, total = v1.physicalMemoryUsed, v1.physicalMemoryTotal
            has_usage = optional("cndevGetDeviceUtilizationInfo", ctypes.byref(usage), handle)
            has_power = optional("cndevGetDevicePowerInfo", ctypes.byref(power), handle)
            has_celsius = optional("cndevGetTemperatureInfo", ctypes.byref(celsius), handle)
        return DeviceReading(
            device_uuid=uuid,
            memory_used_bytes=int(used) << 20 if has_memory else None,
            memory_total_bytes=int(total) << 20 if has_memory else None,
            utilization_percent=usage.averageCoreUtilization if has_usage else None,
            power_watts=power.usage if has_power else None,
            temperature_celsius=celsius.board if has_celsius else None,
        )

    def processes(self, index: int) -> list[tuple[int, int]]:
        """(PID, device memory in bytes) of each process on card `index`, CNDev's physical memory count."""
        with self._lock:
            self._has("cndevGetProcessInfo")
            handle = self._handle(index)
            count = ctypes.c_uint32(32)
            for _ in range(4):  # processes may start between two calls
                size = max(1, count.value)
                infos = (_ProcessInfo * size)()
                for info in infos:
                    info.version = CNDEV_VERSION_6
                count = ctypes.c_uint32(size)
                code = int(self._lib.cndevGetProcessInfo(ctypes.byref(count), infos, handle))
                if code == INSUFFICIENT_SPACE and count.value > size:
                    continue  # CNDev answered how many there are: ask again with room for them
                if code != 0:
                    raise CndevError("cndevGetProcessInfo", code)
                return [(int(p.pid), int(p.physicalMemoryUsed) << 10) for p in infos[: min(count.value, size)]]
            raise CndevError("cndevGetProcessInfo", INSUFFICIENT_SPACE)

    # ------------------------------------------------------------------------------------------ sMLU

    def smlu_enabled(self, index: int) -> bool:
        """Whether card `index` is in sMLU mode (False where the driver has no sMLU at all)."""
        with self._lock:
            if not hasattr(self._lib, "cndevGetSMLUMode"):
                return False
            mode = _SmluMode(version=CNDEV_VERSION_6)
            self._call("cndevGetSMLUMode", ctypes.byref(mode), self._handle(index))
            return bool(mode.smluMode == 1)

    def profiles(self, index: int) -> list[SmluProfile]:
        """The sMLU profiles of card `index`."""
        with self._lock:
            self._has("cndevGetSMluProfileIdInfo", "cndevGetSMluProfileInfo")
            handle = self._handle(index)
            ids = _SmluProfileIds(version=CNDEV_VERSION_6)
            self._call("cndevGetSMluProfileIdInfo", ctypes.byref(ids), handle)
            out = []
            for i in range(max(0, min(ids.count, 128))):
                info = _SmluProfileInfo(version=CNDEV_VERSION_6)
                self._call("cndevGetSMluProfileInfo", ctypes.byref(info), ctypes.c_int32(ids.profileId[i]), handle)
                out.append(
                    SmluProfile(
                        id=int(ids.profileId[i]),
                        quota=int(info.mluQuota[0]),
                        memory_bytes=int(info.memorySize[0]),
                        remaining=int(info.remainCapacity),
                        total=int(info.totalCapacity),
                    )
                )
            return out

    def create_profile(self, index: int, quota: int, memory_bytes: int) -> int:
        """A new profile on card `index`; its id."""
        with self._lock:
            self._has("cndevCreateSMluProfileInfo")
            wanted = _SmluSet(version=CNDEV_VERSION_6, mluQuota=quota, memorySize=memory_bytes)
            profile = ctypes.c_int32(0)
            self._call("cndevCreateSMluProfileInfo", ctypes.byref(wanted), ctypes.byref(profile), self._handle(index))
            return int(profile.value)

    def destroy_profile(self, index: int, profile: int) -> None:
        with self._lock:
            self._has("cndevDestroySMluProfileInfo")
            self._call("cndevDestroySMluProfileInfo", ctypes.c_int32(profile), self._handle(index))

    def create_instance(self, index: int, profile: int, name: str) -> int:
        """A new instance of `profile` on card `index`, named `name`; its handle."""
        with self._lock:
            self._has("cndevCreateSMluInstanceByProfileId")
            handle = ctypes.c_int32(0)
            self._call(
                "cndevCreateSMluInstanceByProfileId",
                ctypes.byref(handle),
                ctypes.c_uint32(profile),
                self._handle(index),
                ctypes.create_string_buffer(name.encode("ascii")),
            )
            return int(handle.value)

    def destroy_instance(self, handle: int) -> None:
        with self._lock:
            self._has("cndevDestroySMluInstanceByHandle")
            self._call("cndevDestroySMluInstanceByHandle", ctypes.c_int32(handle))

    def instances(self, index: int) -> list[SmluInstance]:
        """Every sMLU instance of card `index`."""
        with self._lock:
            self._has("cndevGetAllSMluInstanceInfo")
            handle = self._handle(index)
            count = ctypes.c_int32(128)
            for _ in range(3):
                size = max(1, count.value)
                infos = (_SmluInfo * size)()
                for info in infos:
                    info.version = CNDEV_VERSION_6
                code = int(self._lib.cndevGetAllSMluInstanceInfo(ctypes.byref(count), infos, handle))
                if code == INSUFFICIENT_SPACE and count.value > size:
                    continue  # CNDev answered how many there are: ask again with room for them
                if code != 0:
                    raise CndevError("cndevGetAllSMluInstanceInfo", code)
                return [
                    SmluInstance(
                        card=index,
                        instance_id=int(info.instanceId),
                        profile_id=int(info.profileId),
                        name=_text(bytes(info.instanceName)),
                        uuid=f"MLU-{_text(bytes(info.uuid))}",
                        device_node=_text(bytes(info.devNodeName)),
                        quota=int(info.mluQuota[0]),
                        memory_bytes=int(info.memorySize[0]),
                    )
                    for info in infos[: max(0, min(count.value, size))]
                ]
            raise CndevError("cndevGetAllSMluInstanceInfo", INSUFFICIENT_SPACE)

    # -------------------------------------------------------------------------------------- MLU-Link

    def link_peers(self, index: int) -> list[str]:
        """The UUIDs (``MLU-<uuid>``) card `index`'s MLU-Link ports reach, one entry per port that is up."""
        with self._lock:
            if not hasattr(self._lib, "cndevGetMLULinkPortNumber"):
                return []
            self._has("cndevGetMLULinkStatusV2", "cndevGetMLULinkRemoteInfo")
            handle = self._handle(index)
            ports = int(self._lib.cndevGetMLULinkPortNumber(handle))
            peers = []
            for port in range(max(0, ports)):
                status = _LinkStatusV2()
                self._call("cndevGetMLULinkStatusV2", ctypes.byref(status), handle, ctypes.c_int32(port))
                if status.macState == 0:
                    continue  # the port is down
                remote = _LinkRemote(version=CNDEV_VERSION_6)
                self._call("cndevGetMLULinkRemoteInfo", ctypes.byref(remote), handle, ctypes.c_int32(port))
                uuid = _text(bytes(remote.uuid))
                if uuid:
                    peers.append(f"MLU-{uuid}")
            return peers
