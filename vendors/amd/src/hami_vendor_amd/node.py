"""This node's AMD GPUs: what AMD SMI and sysfs say of each, and the inventory HAMi registers from them.

Owns the node runtime kept with the settings (`runtime_for`): the AMD SMI session (`hami_vendor_amd.amdsmi`, opened
once, said once when there is none) and the GPUs last read, each with what HAMi's AMD device plugin finds beside
AMD SMI: its DRM nodes (``card<N>``, ``renderD<M>``, under its PCI device in sysfs, core's `hami.pcidevice`) and the
UUID ROCr knows it by (``GPU-<16 lower-case hex digits>`` of the ``unique_id`` of the KFD topology node whose
``drm_render_minor`` is the GPU's render node, ``<sysfsRoot>/class/kfd/kfd/topology/nodes/*/properties``), which
``ROCR_VISIBLE_DEVICES`` needs. As in HAMi's plugin, a GPU without either, or without compute units or memory, is not
registered (a log line says why); a GPU whose AMD SMI calls fail is not either, and the others keep being served.
The session and what is said when AMD SMI is missing or fails are core's `hami.vendordriver.DriverReader`'s (there is
no tool to fall back on).

The inventory is HAMi's JSON register under ``hami.io/node-amd-register``: id = the AMD SMI UUID, index = the DRM
card number, count ``splitCount``, ``devmem`` MiB, ``devcore`` = the GPU's compute units, type = AMD SMI's market
name (``amd-gpu`` where it gives none), the NUMA node, ``devicevendor`` ``amd`` and ``custominfo.pciBDF``.

For the node monitor, `NodeRuntime.readings`: what AMD SMI reads from each GPU now (VRAM in use, busy share, power,
temperature); none on simulated devices or without AMD SMI.

On simulated devices (`simulate`) the inventory's devices stand in for AMD SMI's GPUs, their DRM nodes and ROCr UUID
from each device's ``driver.card``, ``driver.render`` and ``driver.rocrUuid``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hami import pcidevice
from hami.model import Device, DeviceReading, NodeInventory
from hami.vendordriver import DriverReader, DriverWords
from hami.vendorstate import devices_named, driver_fact
from hami_vendor_amd.amdsmi import AmdSmi, AmdSmiError
from hami_vendor_amd.settings import AmdSettings

__all__ = ["DEFAULT_TYPE", "AmdGpu", "NodeRuntime", "inventory", "rocr_uuids", "runtime_for", "simulated_gpus"]

log = logging.getLogger("hami_vendor_amd")

DEFAULT_TYPE = "amd-gpu"
_PROPERTY = re.compile(r"^(\w+)\s+(-?\d+)\s*$")


@dataclass(frozen=True)
class AmdGpu:
    """One GPU with everything a container's edits need."""

    uuid: str
    card: int
    render: int
    rocr_uuid: str
    model: str
    compute_units: int
    memory_mib: int
    numa: int = 0
    bdf: str = ""


def rocr_uuids(sysfs_root: Path) -> dict[int, str]:
    """ROCr's UUID of each GPU of the KFD topology, by its render node minor (CPU nodes have none)."""
    out: dict[int, str] = {}
    for properties in sorted((sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*/properties")):
        try:
            lines = properties.read_text().splitlines()
        except OSError:
            continue
        values: dict[str, str] = {}
        for line in lines:
            if m := _PROPERTY.match(line):
                values[m.group(1)] = m.group(2)
        unique, render = int(values.get("unique_id", "0")), int(values.get("drm_render_minor", "0"))
        if unique > 0 and render > 0:
            out[render] = f"GPU-{unique:016x}"
    return out


def inventory(gpus: Sequence[AmdGpu], settings: AmdSettings) -> list[NodeInventory]:
    devices = [
        Device(id=g.uuid, index=g.card, count=settings.split_count, devmem=g.memory_mib, devcore=g.compute_units,
               type=g.model or DEFAULT_TYPE, numa=g.numa, vendor="amd", custom={"pciBDF": g.bdf} if g.bdf else {})
        for g in gpus
    ]  # fmt: skip
    return [NodeInventory(kind="AMD", devices=tuple(devices))] if devices else []


def simulated_gpus(devices: Sequence[Device], driver: Mapping[str, Mapping[str, Any]]) -> list[AmdGpu]:
    """:raises HamiError: a device lacks ``driver.card``, ``driver.render`` or ``driver.rocrUuid``."""
    return [
        AmdGpu(uuid=d.id, card=driver_fact(driver, d.id, "card", int), render=driver_fact(driver, d.id, "render", int),
               rocr_uuid=driver_fact(driver, d.id, "rocrUuid", str), model=d.type, compute_units=d.devcore,
               memory_mib=d.devmem, numa=max(d.numa, 0))
        for d in devices
    ]  # fmt: skip


class NodeRuntime:
    """The AMD SMI session and the GPUs last read (one per settings object)."""

    def __init__(self, settings: AmdSettings) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        self.reader: DriverReader[AmdSmi] = DriverReader(
            log,
            DriverWords(
                "AMD SMI",
                "the AMD GPUs",
                no_tool="{problem}: this node reports no AMD GPU",
                opened="AMD SMI opened from {where}",
            ),
            open=lambda: AmdSmi.open(settings.amd_smi_library),
        )
        self.gpus: list[AmdGpu] = []
        self.simulated = False

    def simulate(self, gpus: list[AmdGpu]) -> None:
        with self.lock:
            self.simulated, self.gpus = True, gpus

    def read(self) -> list[AmdGpu]:
        """This node's GPUs now; none (said once) without AMD SMI or when it fails (then asked again next time)."""
        with self.lock:
            if not self.simulated:
                listed = self.reader.read(AmdSmi.gpus)
                self.gpus = [] if listed is None else self._complete(listed)
            return self.gpus

    def _complete(self, listed: Sequence[Any]) -> list[AmdGpu]:
        sysfs = Path(self.settings.sysfs_root)
        rocr = rocr_uuids(sysfs)
        out = []
        for position, gpu in enumerate(listed):
            if isinstance(gpu, AmdSmiError):
                log.error("AMD GPU %d is not reported: %s", position, gpu)
                continue
            nodes = pcidevice.drm_nodes(sysfs, gpu.bdf)
            why = ""
            if nodes is None:
                why = f"sysfs shows no DRM card and render node for {gpu.bdf}"
            elif int(nodes[1][7:]) not in rocr:
                why = f"no KFD topology node has render minor {nodes[1][7:]} (ROCr would not see it)"
            elif gpu.compute_units <= 0 or gpu.vram_bytes <= 0:
                why = f"AMD SMI reports {gpu.compute_units} compute units and {gpu.vram_bytes} bytes of VRAM"
            if why or nodes is None:
                log.warning("AMD GPU %s (%s) is not reported: %s", gpu.uuid, gpu.bdf, why)
                continue
            render = int(nodes[1][7:])
            out.append(AmdGpu(uuid=gpu.uuid, card=int(nodes[0][4:]), render=render, rocr_uuid=rocr[render],
                              model=gpu.model, compute_units=gpu.compute_units, memory_mib=gpu.vram_bytes >> 20,
                              numa=gpu.numa, bdf=gpu.bdf))  # fmt: skip
        return out

    def readings(self) -> list[DeviceReading] | None:
        """What AMD SMI reads from this node's GPUs now; None on simulated devices, without AMD SMI, or when it fails
        this round (the monitor then shows the GPUs' figures unknown)."""
        with self.lock:
            session = None if self.simulated else self.reader.opened()
            if session is None:
                return None
            try:
                return session.readings()
            except AmdSmiError as exc:
                log.warning("cannot read the AMD GPUs' figures this round: %s", exc)
                return None

    def by_uuid(self, uuids: Sequence[str]) -> list[AmdGpu]:
        """The GPUs with these UUIDs (read again when one is not known).

        :raises HamiError: a UUID is not a GPU of this node."""
        with self.lock:
            return devices_named(uuids, self.gpus, self.read, what="AMD GPU", name_of=lambda g: g.uuid)


def runtime_for(settings: AmdSettings) -> NodeRuntime:
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))
