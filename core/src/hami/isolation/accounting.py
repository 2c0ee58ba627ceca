"""Read a container's accounting file, as written by its isolation library (layout: ``LAYOUT.md`` beside this module).

Every process of a container that uses the device shares one file (``CUDA_DEVICE_MEMORY_SHARED_CACHE`` for NVIDIA):
per device the container's limits, what it holds, its launches and device time; per process a slot with what that
process holds. The node daemon's monitor reads it for metrics with :func:`read_accounting`; it never takes the
file's lock (a robust mutex that only the library's processes use), so what it reads is a snapshot of counters
that are each read whole but may be a few operations apart from one another.

The one thing written from outside is a device's *control word* (:func:`set_device_control`): the node daemon may
lift a container's compute limit for a while (when the device is otherwise idle; policy ``default`` only), or make
a low-priority container (``CUDA_TASK_PRIORITY`` >= 1) yield for a while (when a high-priority one is busy on the
same device). Both expire by themselves at the given wall-clock time. For a container with a grant
(`hami.isolation.grant`) the library ignores these words and reads them from the read-only grant directory
instead (`hami.isolation.grant.set_grant_control`); they remain for containers without one.

**Trust boundary.** Every process of a container can write this file (it must: each updates its own slot and the
shared totals under the file's lock), so nothing in it is evidence against the container. What the container gets
from the node is not in it: its limits come from the grant and its compute-limit lift from the grant's control
words, both read-only to it; the limits written here are a copy for the monitor, never read back as
configuration. What a process can still do by writing here is lower the container's own counted usage, which lets
it allocate past its grant through the library, or raise it, which only refuses its own allocations. An in-process
library cannot stop that, nor a process that patches its own memory or bypasses the library (a static binary):
the counters here are the container's own account of itself. Numbers that decide anything for other tenants
(scheduling, kills) must come from the vendor's management library on the node, per process (the backstop the
node daemon's monitor is meant to run; not built yet), with this file as a report at most.

Process ids are those of the container's pid namespace; liveness cannot be judged from here.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAGIC",
    "VERSION",
    "AccountingFileError",
    "ContainerAccount",
    "ControlMode",
    "DeviceAccount",
    "ProcessAccount",
    "ProcessDeviceAccount",
    "parse_accounting",
    "read_accounting",
    "read_tampered",
    "set_device_control",
]

MAGIC = int.from_bytes(b"HAMIACCT", "little")
VERSION = 1

_HEADER_SIZE = 80  # magic .. vendor: the part of the header every version keeps
_DEVICE_OFFSET = 1024
_DEVICE_SIZE = 256
_DEVICE = {  # field: (offset in the device record, format)
    "memory_used": (0, "Q"),
    "memory_limit": (8, "Q"),
    "memory_peak": (16, "Q"),
    "tampered": (24, "Q"),
    "tampered_ns": (32, "Q"),
    "core_limit": (80, "I"),
    "policy": (84, "I"),
    "control_mode": (128, "I"),
    "control_until_ns": (136, "Q"),
    "last_kernel_ns": (144, "Q"),
    "launches": (152, "Q"),
    "device_time_ns": (160, "Q"),
}
_UUID = (192, 64)
_SLOT_HEAD = struct.Struct("<iIQiIQ")  # pid, state, start_time, priority, flags, registered_ns
_SLOT_DEVICE = struct.Struct("<QQQQ")  # memory_used, launches, device_time_ns, last_kernel_ns
_SLOT_DEVICE_OFFSET = 64
_POLICIES = {0: "default", 1: "force", 2: "disable"}


class AccountingFileError(ValueError):
    """The file is not an accounting file this reader understands; the message says why and what to do."""


class ControlMode(enum.IntEnum):
    """What the node daemon asks of a container's compute limiter on one device (until a given time)."""

    NONE = 0
    LIFT = 1  # run without the compute limit (policy "default" only; "force" keeps it)
    YIELD = 2  # low-priority processes (CUDA_TASK_PRIORITY >= 1) pause their launches


@dataclass(frozen=True)
class DeviceAccount:
    """One device as the container sees it (its index among the container's visible devices)."""

    index: int
    uuid: str
    memory_limit: int  # bytes; 0 = no limit
    memory_used: int  # bytes held by the container's live processes
    memory_peak: int
    core_limit: int  # percent of device time; 0 = no limit
    policy: str  # GPU_CORE_UTILIZATION_POLICY: default | force | disable
    launches: int
    device_time_ns: int  # device time charged to the container (estimated from sampled launches)
    last_kernel_ns: int  # wall-clock time of a recent launch, 0 = none yet
    control_mode: ControlMode
    control_until_ns: int
    tampered: int = 0  # times a process of the container found the figures lowered behind its back (and refused)
    tampered_ns: int = 0  # wall-clock time of the last, 0 = never


@dataclass(frozen=True)
class ProcessDeviceAccount:
    """What one process holds and did on one device."""

    device: int
    memory_used: int
    launches: int
    device_time_ns: int
    last_kernel_ns: int


@dataclass(frozen=True)
class ProcessAccount:
    """A process slot in use (the process may have died since: slots are reclaimed by the library)."""

    slot: int
    pid: int
    start_time: int  # clock ticks after boot, from /proc/<pid>/stat
    priority: int
    registered_ns: int
    devices: tuple[ProcessDeviceAccount, ...]  # only devices the process touched

    @property
    def memory_used(self) -> int:
        return sum(d.memory_used for d in self.devices)


@dataclass(frozen=True)
class ContainerAccount:
    """The whole file."""

    path: str
    version: int
    vendor: str
    created_ns: int
    updated_ns: int
    device_count: int
    priority: int
    oversubscribe: bool
    devices: tuple[DeviceAccount, ...]
    processes: tuple[ProcessAccount, ...]

    def device(self, index: int) -> DeviceAccount:
        """The device with this index; KeyError when the file has no data for it."""
        for device in self.devices:
            if device.index == index:
                return device
        raise KeyError(f"{self.path} has no device {index} (devices: {[d.index for d in self.devices]})")


def _control_mode(value: int) -> ControlMode:
    try:
        return ControlMode(value)
    except ValueError:
        return ControlMode.NONE


def read_tampered(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """Each device record's ``tampered`` count (LAYOUT.md), from the header alone (the file's first 8 KiB of its
    1 MiB, for the node daemon's every round). Raises AccountingFileError when it is not an accounting file,
    OSError when unreadable."""
    with open(path, "rb") as handle:
        data = handle.read(_DEVICE_OFFSET + 16 * _DEVICE_SIZE)
    head = _header(data, str(path))
    count = min(head.device_slots, (len(data) - _DEVICE_OFFSET) // _DEVICE_SIZE)
    offset = _DEVICE["tampered"][0]
    return tuple(struct.unpack_from("<Q", data, _DEVICE_OFFSET + i * _DEVICE_SIZE + offset)[0] for i in range(count))


def read_accounting(path: str | os.PathLike[str]) -> ContainerAccount:
    """Read the accounting file at `path`. Raises AccountingFileError when it is not one, OSError when unreadable."""
    with open(path, "rb") as handle:
        data = handle.read()
    return parse_accounting(data, str(path))


@dataclass(frozen=True)
class _Header:
    version: int
    header_size: int
    slot_size: int
    slot_count: int
    device_slots: int
    device_count: int
    created_ns: int
    updated_ns: int
    slot_hwm: int
    priority: int
    flags: int
    vendor: str


def _header(data: bytes, where: str) -> _Header:
    if len(data) < _HEADER_SIZE:
        raise AccountingFileError(
            f"{where} is {len(data)} bytes, too short for an accounting file: is it the library's "
            "CUDA_DEVICE_MEMORY_SHARED_CACHE file, and has a process using the device started?"
        )
    magic, version, header_size, slot_size, slot_count, device_slots, device_count, created, updated, hwm = (
        struct.unpack_from("<QIIIIIIQQI", data, 0)
    )
    if magic != MAGIC:
        raise AccountingFileError(
            f"{where} does not start with the accounting magic {MAGIC:#x} (found {magic:#x}): it was not "
            "written by a HAMi isolation library of this project (or is still being created)"
        )
    if version != VERSION:
        raise AccountingFileError(
            f"{where} has layout version {version}; this reader knows version {VERSION}: upgrade hami-core to "
            "match the isolation library"
        )
    priority, flags = struct.unpack_from("<II", data, 56)
    vendor = data[64:80].split(b"\0", 1)[0].decode("ascii", "replace")
    return _Header(
        version, header_size, slot_size, slot_count, device_slots, device_count, created, updated, hwm, priority,
        flags, vendor,
    )  # fmt: skip


def parse_accounting(data: bytes, where: str = "<bytes>") -> ContainerAccount:
    """Decode the bytes of an accounting file (see :func:`read_accounting`)."""
    head = _header(data, where)
    header_size, slot_size, slot_count = head.header_size, head.slot_size, head.slot_count
    device_slots, hwm, device_count = head.device_slots, head.slot_hwm, head.device_count
    needed = header_size + min(hwm, slot_count) * slot_size
    if len(data) < needed or len(data) < _DEVICE_OFFSET + device_slots * _DEVICE_SIZE:
        raise AccountingFileError(f"{where} is truncated: {len(data)} bytes, its header describes {needed}")

    devices = []
    for index in range(device_slots):
        base = _DEVICE_OFFSET + index * _DEVICE_SIZE
        values = {name: struct.unpack_from("<" + fmt, data, base + off)[0] for name, (off, fmt) in _DEVICE.items()}
        raw_uuid = data[base + _UUID[0] : base + _UUID[0] + _UUID[1]]
        uuid = raw_uuid.split(b"\0", 1)[0].decode("utf-8", "replace")
        active = values["memory_used"] or values["launches"] or values["memory_peak"]
        if index >= device_count and not active:
            continue
        devices.append(
            DeviceAccount(
                index=index,
                uuid=uuid,
                memory_limit=values["memory_limit"],
                memory_used=values["memory_used"],
                memory_peak=values["memory_peak"],
                core_limit=values["core_limit"],
                policy=_POLICIES.get(values["policy"], str(values["policy"])),
                launches=values["launches"],
                device_time_ns=values["device_time_ns"],
                last_kernel_ns=values["last_kernel_ns"],
                control_mode=_control_mode(values["control_mode"]),
                control_until_ns=values["control_until_ns"],
                tampered=values["tampered"],
                tampered_ns=values["tampered_ns"],
            )
        )

    processes = []
    for slot in range(min(hwm, slot_count)):
        base = header_size + slot * slot_size
        pid, _state, start_time, priority, _flags, registered = _SLOT_HEAD.unpack_from(data, base)
        if pid == 0:
            continue
        touched = []
        for device in range(device_slots):
            used, launches, device_time, last_kernel = _SLOT_DEVICE.unpack_from(
                data, base + _SLOT_DEVICE_OFFSET + device * _SLOT_DEVICE.size
            )
            if used or launches or device_time:
                touched.append(ProcessDeviceAccount(device, used, launches, device_time, last_kernel))
        processes.append(ProcessAccount(slot, pid, start_time, priority, registered, tuple(touched)))

    return ContainerAccount(
        path=where,
        version=head.version,
        vendor=head.vendor,
        created_ns=head.created_ns,
        updated_ns=head.updated_ns,
        device_count=device_count,
        priority=head.priority,
        oversubscribe=bool(head.flags & 1),
        devices=tuple(devices),
        processes=tuple(processes),
    )


def set_device_control(path: str | os.PathLike[str], device: int, mode: ControlMode, until_ns: int) -> None:
    """Ask the container's processes, on `device`, to lift their compute limit or yield, until `until_ns`.

    `until_ns` is wall-clock time (``time.time_ns()``); past it the request lapses by itself. ``ControlMode.NONE``
    withdraws a request at once.
    """
    with open(path, "r+b") as handle:
        data = handle.read(_HEADER_SIZE)
        device_slots = _header(data, str(Path(path))).device_slots
        if not 0 <= device < device_slots:
            raise AccountingFileError(f"{path} has devices 0-{device_slots - 1}, not {device}")
        base = _DEVICE_OFFSET + device * _DEVICE_SIZE
        with mmap.mmap(handle.fileno(), _DEVICE_OFFSET + device_slots * _DEVICE_SIZE) as region:
            until_at, mode_at = base + _DEVICE["control_until_ns"][0], base + _DEVICE["control_mode"][0]
            if mode == ControlMode.NONE:
                region[mode_at : mode_at + 4] = struct.pack("<I", 0)
            region[until_at : until_at + 8] = struct.pack("<Q", until_ns)
            region[mode_at : mode_at + 4] = struct.pack("<I", int(mode))
