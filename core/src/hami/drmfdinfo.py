"""The kernel's DRM client usage statistics: one open DRM file's ``/proc/<pid>/fdinfo/<fd>``, read and parsed.

Owns the format of Linux's ``Documentation/gpu/drm-usage-stats.rst`` as this project reads it, and the reading of
one process's open DRM files from a /proc tree (the host's, or a test's):

- one ``key: value`` pair a line, the key before the first colon, whitespace after it ignored; only the
  standardised keys (``drm-``) are read, a driver's own keys (``<driver>-``) and the generic ones every fdinfo
  file has (``pos``, ``flags``, ``mnt_id``, ``ino``) are not;
- ``drm-driver`` is mandatory: a file without it is no DRM client (a socket's, a pipe's, a dma-buf's fdinfo) and
  gives None; ``drm-pdev`` is the PCI slot address (normalised to sysfs's form, ``0000:3b:00.0``);
  ``drm-client-id`` names the open DRM file (`struct drm_file`), unique globally or per ``drm-pdev``, so a
  descriptor duplicated or shared between processes is the same client and is counted once;
- ``drm-engine-<engine>: <n> ns`` is the time that engine was busy for this client, ``drm-engine-capacity-<engine>``
  how many identical engines the name stands for (1 when absent; 0 is not allowed and is ignored), and
  ``drm-cycles-<engine>`` / ``drm-total-cycles-<engine>`` busy and total cycles;
- memory, per region (``vram``, ``gtt``, ...; ``memory`` is reserved for system memory): ``drm-total-``,
  ``drm-shared-``, ``drm-resident-``, ``drm-purgeable-``, ``drm-active-`` and the deprecated ``drm-memory-``
  (amdgpu's, an alias of ``drm-resident-``), each ``<n>`` bytes or ``<n> KiB`` / ``<n> MiB``.

A key said twice (the kernel never does; a client's own name, ``drm-client-name``, is the one line a process
chooses, and it comes after the identity keys) is read so that no second line can lower a figure or move a client:
``drm-driver``, ``drm-pdev`` and ``drm-client-id`` keep their first value, every figure its largest and a capacity
its smallest. A line that breaks the format (a key with whitespace, a number that is not one, a unit the document
does not name) is skipped, never an error: the file is the kernel's, but what a process opens is its own business,
and nothing it holds may stop a read. Unsigned values above 2^64 are not numbers. Parsing never raises on any text.

`read_process` walks one process's descriptors (``/proc/<pid>/fd``): only those open on a character device (the
link followed, so a device node renamed or moved inside a container is still found) have their fdinfo read, at
most 64 KiB each; a process or descriptor that is gone, or not readable, is skipped. It writes nothing, and knows
no vendor: which driver, devices and regions count is the caller's (`hami.model.DrmUsageSource`).

`DrmFdinfo` is the configuration block a vendor whose kernel driver is a DRM driver embeds in its settings
(``drmFdinfo:``), so that every such vendor offers the same four options (``enabled``, ``drivers``,
``memoryRegions``, ``engines``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from hami.model import DrmUsageSource
from hami.pcidevice import short_bus_id
from hami.vendorstate import VendorSettings

__all__ = [
    "MEMORY_CATEGORIES",
    "DrmClient",
    "DrmFdinfo",
    "memory_bytes",
    "parse_fdinfo",
    "read_process",
]

MEMORY_CATEGORIES = ("total", "shared", "resident", "purgeable", "active", "memory")
"""The memory keys' categories, as ``drm-<category>-<region>``."""
_UNITS = {"": 1, "KiB": 1024, "MiB": 1024 * 1024}
_UINT = re.compile(r"([0-9]{1,20})(?:[ \t]+([A-Za-z]+))?")
_KEYSTR = re.compile(r"[^\s:]+")
_PDEV = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_U64 = (1 << 64) - 1
_READ_LIMIT = 64 * 1024
_IDENTITY = frozenset({"drm-driver", "drm-pdev", "drm-client-id"})


@dataclass(frozen=True)
class DrmClient:
    """One open DRM file, as its fdinfo describes it."""

    driver: str
    pdev: str = ""
    """The PCI slot address in sysfs's form (``0000:3b:00.0``); empty when the file names none."""
    client_id: int | None = None
    engines: Mapping[str, int] = field(default_factory=dict)
    """Engine → nanoseconds it was busy for this client."""
    capacity: Mapping[str, int] = field(default_factory=dict)
    """Engine → how many identical engines it stands for, where the file says (otherwise 1)."""
    cycles: Mapping[str, int] = field(default_factory=dict)
    total_cycles: Mapping[str, int] = field(default_factory=dict)
    memory: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Category (`MEMORY_CATEGORIES`) → region → bytes."""


def _uint(value: str, units: Mapping[str, int]) -> int | None:
    found = _UINT.fullmatch(value)
    if found is None or (found.group(2) or "") not in units:
        return None
    number = int(found.group(1)) * units[found.group(2) or ""]
    return number if int(found.group(1)) <= _U64 else None


def _put(into: dict[str, int], name: str, value: int | None) -> None:
    if name and value is not None:
        into[name] = max(value, into.get(name, 0))


def parse_fdinfo(text: str) -> DrmClient | None:
    """The DRM client one fdinfo file describes, or None when it describes none (no ``drm-driver``). Never raises."""
    driver, pdev, client_id = "", "", None
    engines: dict[str, int] = {}
    capacity: dict[str, int] = {}
    cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    memory: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    for line in text.split("\n"):
        key, sep, raw = line.partition(":")
        if not sep or not key.startswith("drm-") or not _KEYSTR.fullmatch(key):
            continue
        value = raw.strip(" \t\r")
        if key in seen:
            continue  # an identity key said again: the kernel's first line is the one (see the module)
        if key in _IDENTITY:
            seen.add(key)
        if key == "drm-driver":
            driver = value if value and "\x00" not in value else driver
        elif key == "drm-pdev":
            bus = short_bus_id(value) if value.isascii() else ""
            pdev = bus if _PDEV.fullmatch(bus) else pdev
        elif key == "drm-client-id":
            client_id = _uint(value, {"": 1})
        elif key.startswith("drm-engine-capacity-"):
            count = _uint(value, {"": 1})
            if count and len(key) > 20:  # "Zero capacity is not allowed"
                capacity[key[20:]] = min(count, capacity.get(key[20:], count))
        elif key.startswith("drm-engine-"):
            _put(engines, key[11:], _uint(value, {"": 1, "ns": 1}))
        elif key.startswith("drm-total-cycles-"):
            _put(total_cycles, key[17:], _uint(value, {"": 1}))
        elif key.startswith("drm-cycles-"):
            _put(cycles, key[11:], _uint(value, {"": 1}))
        else:
            category, _, region = key[len("drm-") :].partition("-")
            size = _uint(value, _UNITS) if category in MEMORY_CATEGORIES and region else None
            if size is not None:
                _put(memory.setdefault(category, {}), region, size)
    if not driver:
        return None
    return DrmClient(driver, pdev, client_id, engines, capacity, cycles, total_cycles, memory)


def memory_bytes(client: DrmClient, regions: tuple[str, ...]) -> int:
    """What `client` holds in `regions`: per region its resident size (``drm-resident-``), else the deprecated
    alias amdgpu prints (``drm-memory-``), else the total of its buffers (``drm-total-``, which counts buffers whose
    backing store is not instantiated yet: the larger figure, used only where the driver gives no other)."""
    held = 0
    for region in regions:
        for category in ("resident", "memory", "total"):
            found = client.memory.get(category, {}).get(region)
            if found is not None:
                held += found
                break
    return held


def read_process(proc_root: Path, pid: int) -> list[tuple[int, DrmClient]]:
    """(descriptor, client) for each open DRM file of process `pid` under `proc_root` (see the module)."""
    base = os.path.join(proc_root, str(pid))
    found: list[tuple[int, DrmClient]] = []
    try:
        fds = os.open(os.path.join(base, "fd"), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return found  # gone, or not ours to read
    infos = -1
    try:
        for name in os.listdir(fds):
            try:
                if not stat.S_ISCHR(os.stat(name, dir_fd=fds).st_mode):  # follows the link to the open file itself
                    continue
                if infos < 0:
                    infos = os.open(os.path.join(base, "fdinfo"), os.O_RDONLY | os.O_DIRECTORY)
                info = os.open(name, os.O_RDONLY, dir_fd=infos)
                try:
                    data = os.read(info, _READ_LIMIT)
                finally:
                    os.close(info)
            except (OSError, ValueError):
                continue  # closed since, or a descriptor of a file the link cannot reach
            if b"drm-driver:" not in data:
                continue  # a character device that is no DRM file (a tty, /dev/null): nothing to parse
            client = parse_fdinfo(data.decode("utf-8", "replace"))
            if client is not None and name.isdigit():
                found.append((int(name), client))
    finally:
        os.close(fds)
        if infos >= 0:
            os.close(infos)
    return found


class DrmFdinfo(VendorSettings):
    """``drmFdinfo:`` in a vendor's settings, read as every section is (`hami.vendorstate.VendorSettings`): whether
    the node daemon reads the kernel's DRM client statistics for its devices, and what it counts (see
    `hami.model.DrmUsageSource`)."""

    enabled: bool = Field(default=False, description="read /proc/<pid>/fdinfo of the served containers' processes")
    drivers: tuple[str, ...] = Field(
        default=(),
        description="the drm-driver names the vendor's devices register (as their fdinfo prints them); none: the "
        "vendor's own, where it knows one",
    )
    memory_regions: tuple[str, ...] = Field(
        default=(),
        description="the driver's memory regions that are the device's own memory (amdgpu: vram); none: the "
        "backstop reads no memory from fdinfo",
    )
    engines: tuple[str, ...] = Field(
        default=(),
        description="the engines whose busy time is the device's busy share (amdgpu: gfx, compute); none: no busy "
        "share from fdinfo",
    )

    def source(self, drivers: tuple[str, ...], devices: Mapping[str, str]) -> DrmUsageSource | None:
        """The source these options describe for a vendor whose devices register as `drivers` (the ``drivers``
        option replaces them; none where the vendor knows no name) and its devices (PCI address → `Device.id`);
        None when it is off, counts nothing or names no driver."""
        drivers = self.drivers or drivers
        if not self.enabled or not (self.memory_regions or self.engines) or not devices or not drivers:
            return None
        return DrmUsageSource(
            drivers=drivers,
            devices={short_bus_id(bus): uuid for bus, uuid in devices.items()},
            memory_regions=self.memory_regions,
            engines=self.engines,
        )
