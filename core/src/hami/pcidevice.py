"""What sysfs says about a PCI device: its NUMA node and its DRM nodes, found by its PCI address.

Owns reading ``<sysfsRoot>/bus/pci/devices/<BDF>/numa_node`` and the ``drm`` directory under the same device
(``card<N>``, ``renderD<N>``: the driver's own link, so the right nodes whatever order cards were probed in),
and normalising bus ids to the form sysfs names them. Vendors whose cards are DRM devices (Hygon, MetaX) or
whose management library gives no NUMA node (NVIDIA) use it; nothing here is vendor-specific, and nothing is
written.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["drm_nodes", "numa_node", "short_bus_id"]

_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")


def short_bus_id(bus_id: str) -> str:
    """A PCI bus id as sysfs names it: lower case, a four-digit domain (``00000000:3B:00.0`` → ``0000:3b:00.0``)."""
    bus = bus_id.strip().lower()
    domain, sep, rest = bus.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


def _device_dir(sysfs_root: Path, bus_id: str) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices" / short_bus_id(bus_id)


def numa_node(sysfs_root: Path, bus_id: str) -> int | None:
    """The NUMA node of a PCI device from sysfs; None when sysfs does not say or says -1."""
    try:
        node = int((_device_dir(sysfs_root, bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def drm_nodes(sysfs_root: Path, bus_id: str) -> tuple[str, str] | None:
    """The first card and render node names of a PCI device (``card1``, ``renderD129``); None when sysfs shows
    the device with no DRM card and render node."""
    try:
        names = [p.name for p in (_device_dir(sysfs_root, bus_id) / "drm").iterdir()]
    except OSError:
        names = []
    card = sorted((n for n in names if _CARD.match(n)), key=lambda n: int(n[4:]))
    render = sorted((n for n in names if _RENDER.match(n)), key=lambda n: int(n[7:]))
    if not card or not render:
        return None
    return card[0], render[0]
